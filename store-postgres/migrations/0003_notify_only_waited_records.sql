-- Waiting (docs/design.md#waiting), cheaper: a record's end is notified
-- only when a waiter marked the record. A transaction that sent a NOTIFY
-- holds a database-wide lock from before its commit until after it
-- (PostgreSQL's async.c: "serialize writers by acquiring a special lock
-- that we hold till after commit"), so with migration 0002's triggers every
-- completion's commit, fsync included, ran one at a time: 16 clients
-- updating rows with fsync on made 3,169 commits/s without the trigger and
-- 354/s with it (pgbench, BENCHMARKS.md "NOTIFY on every completion").
--
-- A waiter sets `watched` (while the row is still started) before the read
-- after which it sleeps; the triggers notify only when OLD.watched. The
-- row lock orders the mark and the write that ends the started state:
-- either the mark comes first and the end is notified, or the end comes
-- first and the waiter's read sees it. The flag stays set for the row's
-- life: a later end of a started state on that row (after a takeover or a
-- reclaim) notifies once more, which costs a notification, never a wake-up.
-- Adding a column with a constant default rewrites no rows.
ALTER TABLE idempotency_keys ADD COLUMN watched boolean NOT NULL DEFAULT false;

DROP TRIGGER idempotency_keys_started_state_ended ON idempotency_keys;
DROP TRIGGER idempotency_keys_started_record_deleted ON idempotency_keys;

CREATE TRIGGER idempotency_keys_started_state_ended
    AFTER UPDATE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.watched AND OLD.state = 'started'
          AND (NEW.state = 'completed' OR NEW.locked_until < OLD.locked_until))
    EXECUTE FUNCTION idempotency_keys_notify_change();

CREATE TRIGGER idempotency_keys_started_record_deleted
    AFTER DELETE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.watched AND OLD.state = 'started')
    EXECUTE FUNCTION idempotency_keys_notify_change();
