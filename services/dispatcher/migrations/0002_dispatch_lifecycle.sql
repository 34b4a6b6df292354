-- What a send needs beyond 0001, and the outbox of job transitions.

ALTER TABLE trigger_history
    ADD COLUMN target_parameters JSONB NOT NULL DEFAULT '{}',
    ADD COLUMN partition_value   TEXT,
    ADD COLUMN window_end_ms     BIGINT;

-- Every transition of every job, in commit order per job, until the publisher has
-- put it on the runs topic. Written by a trigger on `jobs`, so no code path can
-- change a job without leaving its transition here.
CREATE TABLE job_transitions (
    id             BIGSERIAL PRIMARY KEY,
    trigger_key    TEXT NOT NULL,
    dependency_id  TEXT NOT NULL,
    target_kind    TEXT NOT NULL,
    target_name    TEXT NOT NULL,
    status         TEXT NOT NULL,
    revision       BIGINT NOT NULL,
    attempt        INT NOT NULL,
    invocation_id  TEXT,
    external_id    TEXT,
    reason         TEXT,
    at             TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE jobs ADD COLUMN dependency_id TEXT NOT NULL DEFAULT '';

CREATE FUNCTION jobs_record_transition() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.external_id IS DISTINCT FROM OLD.external_id THEN
        INSERT INTO job_transitions (trigger_key, dependency_id, target_kind, target_name,
                                     status, revision, attempt, invocation_id, external_id, reason)
        VALUES (NEW.trigger_key, NEW.dependency_id, NEW.target_kind, NEW.target_name,
                NEW.status, NEW.revision, NEW.attempt, NEW.invocation_id, NEW.external_id, NEW.reason);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_transitions AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_record_transition();

-- Follow polls and adoption of RUNNING jobs whose follower's lease ran out.
CREATE INDEX jobs_running_follow ON jobs (next_attempt_at) WHERE status = 'RUNNING';
-- Reconcile of UNKNOWN jobs.
CREATE INDEX jobs_unknown ON jobs (next_attempt_at) WHERE status = 'UNKNOWN';
