-- Waiting (docs/design.md#waiting): every write that ends a started state
-- notifies channel idem_record_changed in the same transaction, whichever
-- path made it (one statement, the locked path, complete_with, an operator):
-- a completion, a release (the lease cut short), an abandon (the row
-- deleted). Listeners get it at commit and never for a rolled-back write.
-- The payload is 'caller:hex key digest', at most 129 bytes (PostgreSQL's
-- limit is 8,000). A takeover or a checkpoint notifies nobody: the record is
-- still started.
CREATE FUNCTION idempotency_keys_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_record_changed', OLD.caller_id || ':' || encode(OLD.idem_key, 'hex'));
    RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_keys_started_state_ended
    AFTER UPDATE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.state = 'started' AND (NEW.state = 'completed' OR NEW.locked_until < OLD.locked_until))
    EXECUTE FUNCTION idempotency_keys_notify_change();

CREATE TRIGGER idempotency_keys_started_record_deleted
    AFTER DELETE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.state = 'started')
    EXECUTE FUNCTION idempotency_keys_notify_change();
