-- +goose Up
-- add column "note" to table: "locks"
ALTER TABLE `locks` ADD COLUMN `note` varchar(256) NULL;

-- +goose Down
-- reverse: add column "note" to table: "locks"
ALTER TABLE `locks` DROP COLUMN `note`;
