-- What sluice-api may do in the dispatcher's database: read runs, history, backfills
-- and the audit log; write the audit log and backfill records; cancel a backfill;
-- settle an UNKNOWN job. Nothing else: triggers and job rows are the dispatcher's.
-- Run it in that database, after the dispatcher's migrations, with the role made:
--   CREATE ROLE sluice_api LOGIN PASSWORD '…';
-- (the integration tests run every API test under exactly these grants.)
GRANT SELECT ON trigger_history, jobs, run_transitions, backfills, api_audit TO sluice_api;
GRANT INSERT ON api_audit, backfills TO sluice_api;
GRANT USAGE ON SEQUENCE api_audit_id_seq TO sluice_api;
GRANT UPDATE (cancelled_at, cancelled_by) ON backfills TO sluice_api;
-- A settle. The transition trigger runs as the dispatcher's role (SECURITY DEFINER),
-- so the API needs no grant on job_transitions or run_transitions.
GRANT UPDATE (status, revision, reason, next_attempt_at, lease_owner, lease_until, updated_at)
    ON jobs TO sluice_api;
-- Notifications: the API finds freshness breaches, dead letters and finished
-- backfills, matches events to rules and delivers them.
GRANT SELECT, INSERT ON notification_events TO sluice_api;
GRANT UPDATE (routed_at) ON notification_events TO sluice_api;
GRANT SELECT, INSERT ON notification_deliveries TO sluice_api;
GRANT UPDATE (status, attempts, next_attempt_at, last_error, finished_at)
    ON notification_deliveries TO sluice_api;
