-- +goose Up
-- create "locks" table
CREATE TABLE `locks` (`id` integer NOT NULL PRIMARY KEY AUTOINCREMENT, `owner_id` varchar(255) NOT NULL, `resource_type` varchar(50) NOT NULL, `resource_id` varchar(255) NOT NULL, `acquired_at` varchar(30) NOT NULL, `expires_at` varchar(30) NOT NULL);
-- create index "lock_resource_type_resource_id" to table: "locks"
CREATE UNIQUE INDEX `lock_resource_type_resource_id` ON `locks` (`resource_type`, `resource_id`);
-- create index "lock_expires_at" to table: "locks"
CREATE INDEX `lock_expires_at` ON `locks` (`expires_at`);
-- create index "lock_owner_id" to table: "locks"
CREATE INDEX `lock_owner_id` ON `locks` (`owner_id`);

-- +goose Down
-- reverse: create index "lock_owner_id" to table: "locks"
DROP INDEX `lock_owner_id`;
-- reverse: create index "lock_expires_at" to table: "locks"
DROP INDEX `lock_expires_at`;
-- reverse: create index "lock_resource_type_resource_id" to table: "locks"
DROP INDEX `lock_resource_type_resource_id`;
-- reverse: create "locks" table
DROP TABLE `locks`;
