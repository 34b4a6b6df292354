-- A statement's job transitions are recorded by one statement, not row by row.
-- The per-row trigger ran a PL/pgSQL call and two or three single-row INSERTs for
-- every transition; a dispatched job makes three (recorded, RUNNING, SUCCEEDED),
-- and the dispatcher moves jobs a hundred at a time. Same rows as before: the
-- outbox and the run history for every insert and every change of status or
-- external id, a notification event when a job becomes FAILED or UNKNOWN.
DROP TRIGGER jobs_transitions ON jobs;
DROP FUNCTION jobs_record_transition();

CREATE FUNCTION jobs_record_transitions() RETURNS trigger AS $$
DECLARE
    -- The rows whose transition is recorded, and whether their status moved
    -- (an external id alone is recorded but is no new event).
    moved text := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT n.*, true AS status_moved FROM new_rows n'
        ELSE 'SELECT n.*, n.status IS DISTINCT FROM o.status AS status_moved
              FROM new_rows n JOIN old_rows o ON o.trigger_key = n.trigger_key
              WHERE n.status IS DISTINCT FROM o.status
                 OR n.external_id IS DISTINCT FROM o.external_id'
    END;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
        RETURN NULL; -- an UPDATE that matched no job (a lost guard, an empty sweep)
    END IF;
    EXECUTE format($sql$
        WITH moved AS MATERIALIZED (%s),
        outbox AS (
            INSERT INTO job_transitions (trigger_key, dependency_id, target_kind, target_name,
                                         status, revision, attempt, invocation_id, external_id, reason)
            SELECT trigger_key, dependency_id, target_kind, target_name,
                   status, revision, attempt, invocation_id, external_id, reason FROM moved
        ),
        history AS (
            INSERT INTO run_transitions (trigger_key, status, revision, attempt, invocation_id,
                                         external_id, reason)
            SELECT trigger_key, status, revision, attempt, invocation_id, external_id, reason
            FROM moved
        )
        INSERT INTO notification_events (event_key, kind, dependency_id, trigger_key, backfill_id, detail)
        SELECT e.kind || ':' || m.trigger_key || ':' || m.revision, e.kind,
               m.dependency_id, m.trigger_key, m.backfill_id,
               jsonb_build_object('target', lower(m.target_kind) || '/' || m.target_name,
                                  'attempt', m.attempt, 'reason', m.reason,
                                  'external_id', m.external_id)
        FROM moved m,
             LATERAL (SELECT CASE m.status WHEN 'FAILED' THEN 'run_failed' ELSE 'job_unknown' END) AS e(kind)
        WHERE m.status_moved AND m.status IN ('FAILED', 'UNKNOWN')
        ON CONFLICT (event_key) DO NOTHING
    $sql$, moved);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER SET search_path = public;

CREATE TRIGGER jobs_transitions_inserted AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_record_transitions();
CREATE TRIGGER jobs_transitions_updated AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_record_transitions();
