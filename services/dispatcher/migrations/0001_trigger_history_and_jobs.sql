-- Exactly-once triggering and the durable job lifecycle (seeds 000 and 002).

-- One row per trigger_key ever accepted: the unique key is the last line of defence
-- against a duplicate trigger, whatever produced it.
CREATE TABLE trigger_history (
    trigger_key        TEXT PRIMARY KEY CHECK (trigger_key ~ '^tk1-[0-9a-f]{32}$'),
    dependency_id      TEXT NOT NULL,
    dependency_version BIGINT NOT NULL,
    target_kind        TEXT NOT NULL,
    target_name        TEXT NOT NULL,
    inputs             JSONB NOT NULL,
    reason             TEXT NOT NULL,
    first_commit_at    TIMESTAMPTZ NOT NULL,
    requested_at       TIMESTAMPTZ NOT NULL,
    recorded_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Where the trigger was read from, for audits.
    source_partition   INT NOT NULL,
    source_offset      BIGINT NOT NULL
);
CREATE INDEX trigger_history_dependency ON trigger_history (dependency_id, recorded_at DESC);

-- The job of each trigger. Every transition is `UPDATE … WHERE revision = $expected`.
CREATE TABLE jobs (
    trigger_key    TEXT PRIMARY KEY REFERENCES trigger_history (trigger_key),
    status         TEXT NOT NULL CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
    revision       BIGINT NOT NULL DEFAULT 0,
    attempt        INT NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    invocation_id  TEXT,
    epoch          BIGINT,
    deadline_at    TIMESTAMPTZ,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    external_id    TEXT,
    reason         TEXT,
    target_kind    TEXT NOT NULL,
    target_name    TEXT NOT NULL,
    lease_owner    TEXT,
    lease_until    TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (status <> 'RUNNING' OR (invocation_id IS NOT NULL AND deadline_at IS NOT NULL))
);
-- The claim query: due PENDING jobs per target, oldest first.
CREATE INDEX jobs_pending ON jobs (target_kind, target_name, next_attempt_at) WHERE status = 'PENDING';
-- The deadline sweep.
CREATE INDEX jobs_running_deadline ON jobs (deadline_at) WHERE status = 'RUNNING';

-- Dispatcher instances: each start takes a new epoch; a lease names its epoch.
CREATE TABLE dispatcher_epochs (
    epoch       BIGSERIAL PRIMARY KEY,
    instance    TEXT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
