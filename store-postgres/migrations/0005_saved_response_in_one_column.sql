-- The saved response in one column, deflated (store-core's codec.rs,
-- encode_response_deflated), instead of four: the design sizes a record at
-- 512 bytes (docs/design.md#sizing), and with the status, two text arrays
-- for the headers and the body in columns of their own the table and its
-- indexes took 652 (BENCHMARKS.md, "A day of keys"). PostgreSQL's own
-- compression never reaches a row this small: it compresses a value in
-- place only once the row passes about 2 KB, whatever toast_tuple_target
-- says. The Label service's 201 takes about 215 bytes here, against 358 in
-- the four columns.
--
-- Expand, then contract: rows written before this migration keep their
-- four columns, and every build from this one reads both forms and writes
-- only `response`. The old rows expire within one retention and the
-- sweeper deletes them; a later migration drops the four columns once none
-- is left. Adding a nullable column without a default rewrites no rows.
-- A build from before this migration reads a completed row of the new form
-- as unreadable (it answers "record unreadable" for that key), so every
-- instance is upgraded before the traffic moves on, and such a row is
-- never cleared with an older build's forget-unreadable-record: a build
-- that reads it keeps it.
ALTER TABLE idempotency_keys ADD COLUMN response bytea;

-- The state rule of migration 0001, with a completed row's response in
-- either form, never both. NOT VALID: checking the existing rows would
-- read the whole table while holding the lock that blocks every request,
-- and each of them met 0001's rule, under which `response` is null, so
-- each meets this one. New and updated rows are checked all the same.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_state_columns;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_state_columns CHECK (
    (state = 'started'
        AND locked_until IS NOT NULL AND lease_token IS NOT NULL
        AND response IS NULL
        AND response_status IS NULL AND response_header_names IS NULL
        AND response_header_values IS NULL AND response_body IS NULL
        AND completed_by IS NULL)
    OR
    (state = 'completed'
        AND locked_until IS NULL AND lease_token IS NULL AND recovery_point IS NULL
        AND completed_by IS NOT NULL
        AND ((response IS NOT NULL
                AND response_status IS NULL AND response_header_names IS NULL
                AND response_header_values IS NULL AND response_body IS NULL)
            OR
            (response IS NULL
                AND response_status IS NOT NULL AND response_header_names IS NOT NULL
                AND response_header_values IS NOT NULL AND response_body IS NOT NULL
                AND cardinality(response_header_names) = cardinality(response_header_values))))
) NOT VALID;
