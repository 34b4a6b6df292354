-- A claim's cost must not grow with the backlog or with the jobs done since the
-- last vacuum. auto_explain of bench-dispatcher with 80,000 jobs waiting showed a
-- 13 ms claim of 64 and an 11 ms look for due targets, every round: statistics
-- taken when the table held ~no PENDING job (a sudden backlog, or a table of past
-- jobs) made the planner read and sort every due job, and count the slots in use
-- through every RUNNING version left since the last vacuum.
--
-- The claim takes a target's due jobs ORDER BY priority DESC, next_attempt_at,
-- trigger_key LIMIT its room: with trigger_key in the index the scan stops at the
-- room. No other index may serve it: jobs_pending goes (the look for due targets
-- skips through this one and the backfills instead). A backfill's items likewise.
DROP INDEX jobs_pending;
DROP INDEX jobs_live_pending;
CREATE INDEX jobs_live_pending ON jobs (target_kind, target_name, priority DESC, next_attempt_at, trigger_key)
    WHERE status = 'PENDING' AND backfill_id IS NULL;
DROP INDEX jobs_backfill_pending;
CREATE INDEX jobs_backfill_pending ON jobs (backfill_id, next_attempt_at, trigger_key)
    WHERE status = 'PENDING' AND backfill_id IS NOT NULL;
-- The jobs holding a target's slots, counted by a plain index scan that marks
-- the dead versions it passes, so the next count skips them (a bitmap scan of
-- (status, updated_at) read 63,000 of them for 64 live ones).
CREATE INDEX jobs_in_flight ON jobs (target_kind, target_name) WHERE status IN ('RUNNING', 'UNKNOWN');
