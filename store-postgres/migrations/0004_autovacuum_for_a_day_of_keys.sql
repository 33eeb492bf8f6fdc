-- Autovacuum sized for tables that turn over every day (BENCHMARKS.md,
-- "A day of keys"). Every request inserts a record, completes it with an
-- update, and the sweeper deletes it once it expires: about two dead tuples
-- per request, for ever. PostgreSQL's default autovacuum_vacuum_scale_factor
-- of 0.2 waits until a fifth of a table is dead; on the design's 34.56M
-- records (docs/design.md#sizing) that is 6.9M dead tuples, about 2.3 hours
-- at 400/s, and no vacuum ran in a 15-minute run at that size while dead
-- tuples grew by 800 a second. One per cent vacuums a table of that size
-- about every 7 minutes; the fixed threshold keeps a small table from being
-- vacuumed after every few hundred requests.
--
-- Autovacuum storage parameters take a SHARE UPDATE EXCLUSIVE lock (the
-- ALTER TABLE reference), so this migration does not block reads or writes.
-- It runs once: an operator may set other values afterwards.
ALTER TABLE idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000
);
ALTER TABLE idempotency_tombstones SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000
);
