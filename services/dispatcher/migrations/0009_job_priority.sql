-- A job's priority (the dependency's target parameter `priority`, an integer,
-- default 0): within one target, the claim starts higher priorities first, then
-- the oldest due. A target is the queue of an engine (its max_in_flight the
-- engine's slots): a table-service policy's compaction of a hot table goes before
-- a cold table's clean. Backfill items keep their own pacing.
ALTER TABLE jobs ADD COLUMN priority INT NOT NULL DEFAULT 0;
DROP INDEX jobs_live_pending;
CREATE INDEX jobs_live_pending ON jobs (target_kind, target_name, priority DESC, next_attempt_at)
    WHERE status = 'PENDING' AND backfill_id IS NULL;
