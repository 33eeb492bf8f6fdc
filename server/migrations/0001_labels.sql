-- The Label service's labels, in the same database as the idempotency
-- records so that a label and its completed record commit together.
-- One label per (caller, order, parcel, version): the second line of
-- defence behind the idempotency key.
CREATE TABLE labels (
    label_id              text        PRIMARY KEY CHECK (octet_length(label_id) BETWEEN 1 AND 64),
    caller_id             text        NOT NULL,
    order_id              numeric(20) NOT NULL CHECK (order_id >= 0),
    parcel_no             bigint      NOT NULL CHECK (parcel_no >= 1),
    label_version         bigint      NOT NULL CHECK (label_version >= 1),
    service               text        NOT NULL CHECK (service IN ('ground', 'express')),
    weight_g              integer     NOT NULL CHECK (weight_g BETWEEN 1 AND 70000),
    tracking_no           text        NOT NULL,
    cost_cents            bigint      NOT NULL CHECK (cost_cents >= 0),
    created_at            timestamptz NOT NULL,
    -- SHA-256 of the idempotency key that made the label, never the key.
    created_by_key_sha256 text        NOT NULL CHECK (length(created_by_key_sha256) = 64),
    CONSTRAINT labels_one_per_parcel UNIQUE (caller_id, order_id, parcel_no, label_version)
);
