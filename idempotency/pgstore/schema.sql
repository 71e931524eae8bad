-- job_results: the idempotency store of berth (pgstore.SQL with the default names).
CREATE SCHEMA IF NOT EXISTS "public";
CREATE TABLE IF NOT EXISTS "public"."job_results" (
    idempotency_key text        NOT NULL PRIMARY KEY,
    job_type        text        NOT NULL DEFAULT '',
    fingerprint     text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    resource_type   text,
    resource_id     text,
    result_json     jsonb,
    owner_token     text,
    locked_until    timestamptz,
    takeovers       integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS "job_results_expires_at_idx" ON "public"."job_results" (expires_at);
