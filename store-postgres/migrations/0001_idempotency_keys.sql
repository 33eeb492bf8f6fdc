-- The design's idempotency_keys table (docs/design.md#backend-postgres), with the key stored as its SHA-256
-- digest (keys may carry personal data) and the response kept as bytes
-- (bodies need not be UTF-8).
CREATE TYPE idempotency_state AS ENUM ('started', 'completed');

CREATE TABLE idempotency_keys (
    caller_id              text              NOT NULL,
    idem_key               bytea             NOT NULL CHECK (octet_length(idem_key) = 32),
    request_hash           bytea             NOT NULL CHECK (octet_length(request_hash) = 32),
    state                  idempotency_state NOT NULL,
    locked_until           timestamptz,
    lease_token            uuid,
    recovery_point         bytea,
    response_status        integer,
    response_header_names  text[],
    response_header_values text[],
    response_body          bytea,
    completed_by           uuid,
    created_at             timestamptz       NOT NULL,
    expires_at             timestamptz       NOT NULL,
    PRIMARY KEY (caller_id, idem_key),
    -- A started row holds a lease and no response; a completed row holds a
    -- response and no lease. Any other mix is a half-written record, which
    -- the database refuses to store.
    CONSTRAINT idempotency_keys_state_columns CHECK (
        (state = 'started'
            AND locked_until IS NOT NULL AND lease_token IS NOT NULL
            AND response_status IS NULL AND response_header_names IS NULL
            AND response_header_values IS NULL AND response_body IS NULL
            AND completed_by IS NULL)
        OR
        (state = 'completed'
            AND locked_until IS NULL AND lease_token IS NULL AND recovery_point IS NULL
            AND response_status IS NOT NULL AND response_header_names IS NOT NULL
            AND response_header_values IS NOT NULL AND response_body IS NOT NULL
            AND completed_by IS NOT NULL
            AND cardinality(response_header_names) = cardinality(response_header_values))
    )
);

-- The sweeper scans expired rows in expires_at order, in batches.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);

-- A purged key leaves a tombstone until its own expires_at, so a retry that
-- arrives after the retention window is reported as late instead of being
-- silently treated as new.
CREATE TABLE idempotency_tombstones (
    caller_id  text        NOT NULL,
    idem_key   bytea       NOT NULL CHECK (octet_length(idem_key) = 32),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (caller_id, idem_key)
);

CREATE INDEX idempotency_tombstones_expires_at ON idempotency_tombstones (expires_at);
