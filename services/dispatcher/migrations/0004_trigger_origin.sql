-- Why a trigger exists: new data (the condition held), a manual run, or a re-run
-- of an earlier run; who asked, the request id that makes a retried request one
-- run, and the run a re-run repeats.
ALTER TABLE trigger_history
    ADD COLUMN origin text NOT NULL DEFAULT 'data'
        CHECK (origin IN ('data', 'manual', 'rerun')),
    ADD COLUMN requested_by text,
    ADD COLUMN request_id text,
    ADD COLUMN rerun_of text REFERENCES trigger_history (trigger_key);

CREATE INDEX trigger_history_reruns ON trigger_history (rerun_of) WHERE rerun_of IS NOT NULL;
