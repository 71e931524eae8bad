package idempotency

import (
	"context"
	"time"
)

// Status is the state of a stored key.
type Status string

// The statuses of a key row.
const (
	// StatusInProgress: claimed in lease mode, not completed yet.
	StatusInProgress Status = "in_progress"
	// StatusCompleted: the operation's effect is done and durable.
	StatusCompleted Status = "completed"
)

// Claim is one attempt to run the operation named by Key.
type Claim struct {
	Key         string
	JobType     string
	Fingerprint string
	// Owner is a random token naming this attempt; completes, releases and
	// extensions are fenced by it.
	Owner string
	// Lease is how long a lease-mode claim holds before another attempt may
	// take it over.
	Lease time.Duration
	// Retention is how long the row is kept before [PurgeExpired] may delete
	// it (from the claim, and again from completion).
	Retention time.Duration
}

// Result is what a handler records about the effect it applied (see
// [SetResult]). All fields are optional; JSON, when set, must be valid JSON.
type Result struct {
	ResourceType string // e.g. "order"
	ResourceID   string // e.g. "order_123"
	JSON         []byte // e.g. {"charge_id":"ch_1","amount":1200}
}

// Record is a stored key row.
type Record struct {
	Key         string
	JobType     string
	Fingerprint string
	Status      Status
	Result      Result
	Owner       string    // owner token of the current claim (in progress), or of the claim that completed it
	LockedUntil time.Time // lease expiry (in progress), by the store's clock
	// LockedFor is how long the in-progress claim had left when the record
	// was read, measured by the store's own clock (PostgreSQL's now(), not
	// the worker's): negative when the claim has expired without being
	// taken over yet. Zero when the store does not report it (or there is no
	// claim); the guard then falls back to LockedUntil against the worker's
	// clock, which is wrong by however much the two clocks differ.
	LockedFor   time.Duration
	CompletedAt time.Time // zero while in progress
	ExpiresAt   time.Time // retention deadline
	Takeovers   int       // how many times an expired claim was taken over
}

// Outcome says what a claim found.
type Outcome int

// The outcomes of [Store.Claim] and [TxStore.Begin].
const (
	// Acquired: the key was free; the caller owns it and runs the handler.
	Acquired Outcome = iota + 1
	// TakenOver: an expired claim with the same fingerprint was taken over;
	// the caller owns it and runs the handler.
	TakenOver
	// Completed: the operation is done; the Record holds its result.
	Completed
	// InProgress: another owner holds a live claim (or an open transaction).
	InProgress
)

// String returns the outcome's name, e.g. "taken_over".
func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case TakenOver:
		return "taken_over"
	case Completed:
		return "completed"
	case InProgress:
		return "in_progress"
	}
	return "unknown"
}

// Store is the durable result store of lease mode: the row with the unique
// key is the truth. Implementations are safe for concurrent use by many
// processes (PostgreSQL) or goroutines (memory).
//
// Claim inserts the key as in progress, or takes over an expired in-progress
// claim whose fingerprint matches — atomically, so that of many concurrent
// claimers exactly one gets TakenOver. When it returns Completed or
// InProgress, the Record describes the row found (its fingerprint may differ
// from the claim's: the caller detects conflicts). Complete and Release are
// fenced by c.Owner and return an error wrapping [ErrClaimLost] when the claim
// was taken over; Complete by the owner whose claim it already completed
// returns nil (a retry after its answer was lost must not read as a lost
// claim); Release deletes the row so the retry can claim it again.
// The guard also calls Release after a Claim that failed, in case the claim
// was stored and only its answer lost; for a claim never stored it returns
// ErrClaimLost.
// Extend pushes a live claim's expiry to d from now. A Record of an
// in-progress claim should carry LockedFor, the time the claim has left by
// the store's clock. Get returns
// [ErrNotFound] for an unknown key. DeleteExpired deletes at most limit rows
// whose retention passed and returns how many it deleted.
//
// Errors other than ErrClaimLost, ErrNotFound and [ErrInvalidKey] are
// transient from the caller's point of view: retrying the call is safe. A
// Claim (or Begin) whose key, job type or fingerprint the store cannot hold
// returns a permanent error ([sdk.Permanent]) wrapping ErrInvalidKey, which
// the guard passes on: the message is dead-lettered rather than retried.
type Store interface {
	Claim(ctx context.Context, c Claim) (Outcome, *Record, error)
	Complete(ctx context.Context, c Claim, r Result) error
	Release(ctx context.Context, c Claim) error
	Extend(ctx context.Context, c Claim, d time.Duration) error
	Get(ctx context.Context, key string) (*Record, error)
	DeleteExpired(ctx context.Context, limit int) (int, error)
}

// TxStore is a Store that can also hold a key inside a transaction with the
// handler's own writes (transactional mode).
//
// Begin opens a transaction and inserts the key row in it. When the key is
// free it returns Acquired and an open Tx; a concurrent Begin of the same key
// blocks until that Tx ends, then sees its outcome (Completed after a commit,
// Acquired after a rollback). For any other outcome the Tx is nil and the
// Record describes the row found. Begin never takes over a lease-mode claim,
// even an expired one (it reports InProgress): use one mode per key.
type TxStore interface {
	Store
	Begin(ctx context.Context, c Claim) (Tx, Outcome, *Record, error)
}

// Tx is an open transaction holding a key. Exactly one of Commit or Rollback
// must be called, from the goroutine that called Begin.
type Tx interface {
	// Context returns ctx carrying the transaction, for the handler (the
	// store's package has the accessor, e.g. pgstore.TxFrom).
	Context(ctx context.Context) context.Context
	// Commit stores r with the key and commits the handler's writes with it.
	Commit(ctx context.Context, r Result) error
	// Rollback undoes everything; the key is free again.
	Rollback(ctx context.Context) error
}

// Cache is a fast, lossy dedupe path (Redis SET NX EX). The middleware
// consults it first and writes it only after the durable store recorded
// success; a miss, an error or a lost cache only costs a store lookup.
//
// Lookup returns the fingerprint remembered for key, and whether there was
// one. Remember records key → fingerprint for ttl if the key is not set.
type Cache interface {
	Lookup(ctx context.Context, key string) (fingerprint string, found bool, err error)
	Remember(ctx context.Context, key, fingerprint string, ttl time.Duration) error
}
