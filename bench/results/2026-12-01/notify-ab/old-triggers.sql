DROP TRIGGER idempotency_keys_started_state_ended ON idempotency_keys;
DROP TRIGGER idempotency_keys_started_record_deleted ON idempotency_keys;
CREATE TRIGGER idempotency_keys_started_state_ended AFTER UPDATE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.state = 'started' AND (NEW.state = 'completed' OR NEW.locked_until < OLD.locked_until))
    EXECUTE FUNCTION idempotency_keys_notify_change();
CREATE TRIGGER idempotency_keys_started_record_deleted AFTER DELETE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.state = 'started') EXECUTE FUNCTION idempotency_keys_notify_change();
