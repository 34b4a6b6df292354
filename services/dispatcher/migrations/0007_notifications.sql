-- Notifications. `notification_events` holds what happened, once per event key
-- (a run FAILED, a job UNKNOWN, a dead letter, a freshness breach, a backfill
-- finished); the API's notifier matches each against the declared rules and
-- writes one `notification_deliveries` row per event and rule, which it sends
-- with retries until the receiver takes it or the row is DEAD (the dead-letter,
-- kept with the last error).
CREATE TABLE notification_events (
    event_key      TEXT PRIMARY KEY,
    kind           TEXT NOT NULL CHECK (kind IN ('run_failed', 'job_unknown', 'dead_letter',
                                                 'freshness_breach', 'backfill_finished')),
    dependency_id  TEXT,
    -- The asset it is about (a dead letter's, a stale input's).
    asset_key      TEXT,
    trigger_key    TEXT,
    backfill_id    TEXT,
    detail         JSONB NOT NULL DEFAULT '{}',
    at             TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- Set once the event has been matched against the rules.
    routed_at      TIMESTAMPTZ
);
CREATE INDEX notification_events_unrouted ON notification_events (at) WHERE routed_at IS NULL;

CREATE TABLE notification_deliveries (
    -- The event key and the rule's name: the notification's key of its own, sent
    -- as the Idempotency-Key header.
    delivery_key     TEXT PRIMARY KEY,
    event_key        TEXT NOT NULL REFERENCES notification_events (event_key),
    rule             TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'DELIVERED', 'DEAD')),
    attempts         INT NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at      TIMESTAMPTZ
);
CREATE INDEX notification_deliveries_due ON notification_deliveries (next_attempt_at)
    WHERE status = 'PENDING';
CREATE INDEX notification_deliveries_by_rule ON notification_deliveries (rule, created_at DESC);

-- A job that becomes FAILED or UNKNOWN is an event in the same transaction as
-- its transition, whoever moved it: none is lost to a crash.
CREATE OR REPLACE FUNCTION jobs_record_transition() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.external_id IS DISTINCT FROM OLD.external_id THEN
        INSERT INTO job_transitions (trigger_key, dependency_id, target_kind, target_name,
                                     status, revision, attempt, invocation_id, external_id, reason)
        VALUES (NEW.trigger_key, NEW.dependency_id, NEW.target_kind, NEW.target_name,
                NEW.status, NEW.revision, NEW.attempt, NEW.invocation_id, NEW.external_id, NEW.reason);
        INSERT INTO run_transitions (trigger_key, status, revision, attempt, invocation_id,
                                     external_id, reason)
        VALUES (NEW.trigger_key, NEW.status, NEW.revision, NEW.attempt, NEW.invocation_id,
                NEW.external_id, NEW.reason);
    END IF;
    IF NEW.status IN ('FAILED', 'UNKNOWN')
       AND (TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status) THEN
        INSERT INTO notification_events (event_key, kind, dependency_id, trigger_key, backfill_id, detail)
        VALUES (CASE NEW.status WHEN 'FAILED' THEN 'run_failed' ELSE 'job_unknown' END
                    || ':' || NEW.trigger_key || ':' || NEW.revision,
                CASE NEW.status WHEN 'FAILED' THEN 'run_failed' ELSE 'job_unknown' END,
                NEW.dependency_id, NEW.trigger_key, NEW.backfill_id,
                jsonb_build_object('target', lower(NEW.target_kind) || '/' || NEW.target_name,
                                   'attempt', NEW.attempt, 'reason', NEW.reason,
                                   'external_id', NEW.external_id))
        ON CONFLICT (event_key) DO NOTHING;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER SET search_path = public;
