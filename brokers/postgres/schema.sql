-- berth PostgreSQL broker: the jobs table (ARCHITECTURE.md's reference schema plus
-- queue, headers, lease_token and the message fields). Every statement is
-- idempotent. Replace "berth" with your schema name, or use
-- postgres.SchemaSQL(schema) / (*postgres.Broker).Migrate.

CREATE SCHEMA IF NOT EXISTS "berth";

CREATE TABLE IF NOT EXISTS "berth".jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL,
    message_id       text        NOT NULL,             -- sdk.Message.ID
    job_type         text        NOT NULL DEFAULT '',  -- sdk.Message.Type
    payload          bytea       NOT NULL,             -- sdk.Message.Body, byte for byte
    payload_json     json,                             -- copy of the body when it is valid JSON, for SQL; NULL otherwise
    headers          jsonb,                            -- sdk.Message.Headers (NULL when the message had none)
    correlation_id   text        NOT NULL DEFAULT '',
    ordering_key     text        NOT NULL DEFAULT '',  -- sdk.Message.Key
    idempotency_key  text,                             -- sdk.Message.IdempotencyKey, NULL when empty
    dedupe           boolean     NOT NULL DEFAULT false, -- enqueued with Options.DedupeEnqueue: the key is unique per queue
    status           text        NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'processing', 'retry', 'completed', 'failed', 'dead_letter')),
    attempt_count    integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    available_at     timestamptz NOT NULL DEFAULT now(), -- when it may be taken: due time, or lease expiry while processing
    visibility_until timestamptz,                        -- the active lease (equals available_at while processing)
    worker_id        text,
    lease_token      uuid,                               -- fences settlements: a new claim makes a new token
    last_error       text,
    first_failure_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Queues declared with DeclareQueue (and queues found holding jobs), so that
-- Stats tells an empty queue from one that does not exist (sdk.ErrNotFound).
-- Publishing does not need a row here: a queue also exists while it holds a job.
CREATE TABLE IF NOT EXISTS "berth".queues (
    name       text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The indexes below are written as PostgreSQL writes them back
-- (pg_get_indexdef: casts, ANY (ARRAY[...]), the predicate on one line):
-- berth doctor (postgres.indexes) compares each index of the table with its
-- definition here, as Migrate (IF NOT EXISTS) keeps an index of the same
-- name whatever its columns.

-- The claim query: claimable rows of a queue in due order. Processing rows
-- carry their lease expiry in available_at, so one range scan finds both new
-- work and expired leases.
CREATE INDEX IF NOT EXISTS jobs_claim_idx ON "berth".jobs (queue, available_at)
    WHERE (status = ANY (ARRAY['queued'::text, 'retry'::text, 'processing'::text]));

-- Enqueue dedupe (Options.DedupeEnqueue): one job per (queue, idempotency_key).
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe_idx ON "berth".jobs (queue, idempotency_key)
    WHERE dedupe;

-- Dead letters by queue, and retention of completed rows.
CREATE INDEX IF NOT EXISTS jobs_dead_letter_idx ON "berth".jobs (queue, message_id)
    WHERE (status = 'dead_letter'::text);
CREATE INDEX IF NOT EXISTS jobs_completed_idx ON "berth".jobs (updated_at)
    WHERE (status = 'completed'::text);

-- Dead-letter pages (DeadLetterPage, DeadLetterPageTo, ListDeadLetters,
-- DeadLetterMark) in their order, so that a page reads its own rows instead
-- of sorting all the queue's dead letters. Added after the first release:
-- Migrate (or applying this file again) creates it on an existing table; on
-- a large busy table, create it beforehand with CREATE INDEX CONCURRENTLY.
CREATE INDEX IF NOT EXISTS jobs_dead_letter_page_idx ON "berth".jobs (queue, updated_at, id)
    WHERE (status = 'dead_letter'::text);
