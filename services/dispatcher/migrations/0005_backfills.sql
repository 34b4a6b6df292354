-- Backfills: a dependency re-run over past partitions, windows or snapshots, one
-- trigger per item. The API writes the request here before it publishes the
-- items' triggers; the dispatcher paces them (live triggers first, each backfill
-- within its own share of the target) and cancels what is still PENDING when the
-- backfill is cancelled.
CREATE TABLE backfills (
    backfill_id    TEXT PRIMARY KEY,
    dependency_id  TEXT NOT NULL,
    project        TEXT NOT NULL,
    target_kind    TEXT NOT NULL,
    target_name    TEXT NOT NULL,
    -- The request as given (its range) and how many items it expanded to.
    request        JSONB NOT NULL,
    items_total    INT NOT NULL CHECK (items_total > 0),
    -- The request's pace; NULL takes the target's share (half its slots, at least one).
    max_in_flight  INT CHECK (max_in_flight > 0),
    per_minute     INT CHECK (per_minute > 0),
    requested_by   TEXT NOT NULL,
    reason         TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    cancelled_at   TIMESTAMPTZ,
    cancelled_by   TEXT
);
CREATE INDEX backfills_dependency ON backfills (dependency_id, created_at DESC);

ALTER TABLE trigger_history DROP CONSTRAINT trigger_history_origin_check;
ALTER TABLE trigger_history ADD CONSTRAINT trigger_history_origin_check
    CHECK (origin IN ('data', 'manual', 'rerun', 'backfill'));

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'CANCELLED'));

-- The backfill a job belongs to (NULL: a live trigger), and when it was last
-- claimed (a backfill's per-minute pace counts claims of the last minute).
ALTER TABLE jobs
    ADD COLUMN backfill_id TEXT REFERENCES backfills (backfill_id),
    ADD COLUMN claimed_at  TIMESTAMPTZ;

-- The claim's live picks leave backfill jobs out (a backlog of backfill items is
-- never scanned to find a live one); its backfill picks and the cancel sweep go
-- by backfill.
CREATE INDEX jobs_live_pending ON jobs (target_kind, target_name, next_attempt_at)
    WHERE status = 'PENDING' AND backfill_id IS NULL;
CREATE INDEX jobs_backfill_pending ON jobs (backfill_id, next_attempt_at)
    WHERE status = 'PENDING' AND backfill_id IS NOT NULL;
CREATE INDEX jobs_backfill ON jobs (backfill_id, status) WHERE backfill_id IS NOT NULL;
CREATE INDEX jobs_backfill_claims ON jobs (backfill_id, claimed_at) WHERE backfill_id IS NOT NULL;
