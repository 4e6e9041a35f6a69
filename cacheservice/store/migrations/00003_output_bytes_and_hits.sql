-- +goose Up

-- output_bytes is the outputs' size as their writer told it, and last_hit_at when a Get
-- last found the entry (written in batches, not on every hit): together they bound a
-- project's cache, the least recently used entries going first. An entry never hit
-- counts as used when it was last written, which greatest() gives, since it skips a NULL.
--
-- An expand: v0.1.0 writes entries without either (0 and NULL). A constant default is
-- kept in the catalog, not written to every row, so the table's exclusive lock lasts
-- only the catalog change. One table per file: a file's locks last until its commit, and
-- one table's lock must not be held while the next is waited for. The index is built in
-- 00006, concurrently.
ALTER TABLE cached_outputs ADD COLUMN IF NOT EXISTS output_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_hit_at timestamptz;
