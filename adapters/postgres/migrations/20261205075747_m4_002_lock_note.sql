-- +goose Up
-- modify "locks" table
ALTER TABLE "locks" ADD COLUMN "note" character varying(256) NULL;

-- +goose Down
-- reverse: modify "locks" table
ALTER TABLE "locks" DROP COLUMN "note";
