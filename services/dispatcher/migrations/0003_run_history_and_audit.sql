-- The control plane's history. `job_transitions` is an outbox (rows leave once the
-- runs topic has them, and that topic is compacted by trigger key), so a run's
-- transitions are kept here too, for good, by the same trigger.
CREATE TABLE run_transitions (
    id             BIGSERIAL PRIMARY KEY,
    trigger_key    TEXT NOT NULL,
    status         TEXT NOT NULL,
    revision       BIGINT NOT NULL,
    attempt        INT NOT NULL,
    invocation_id  TEXT,
    external_id    TEXT,
    reason         TEXT,
    at             TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX run_transitions_run ON run_transitions (trigger_key, id);

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
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE INDEX jobs_by_status ON jobs (status, updated_at DESC);
CREATE INDEX jobs_by_dependency ON jobs (dependency_id, created_at DESC);

-- Every change made through sluice-api: who, what, when, before and after.
CREATE TABLE api_audit (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    principal  TEXT NOT NULL,
    action     TEXT NOT NULL,
    resource   TEXT NOT NULL,
    project    TEXT NOT NULL,
    before     JSONB,
    after      JSONB,
    request_id TEXT
);
CREATE INDEX api_audit_at ON api_audit (at DESC);
