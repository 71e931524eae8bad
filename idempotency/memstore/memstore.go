// Package memstore is an in-memory idempotency store for tests and demos. It
// keeps the semantics of the PostgreSQL store — a unique key, in-progress
// claims with expiry and a fenced takeover, transactions that block a
// concurrent duplicate until they end — within one process. It is not
// durable: a process that dies forgets every key.
package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/berthq/berth/idempotency"
)

// Options configures a Store. The zero value is ready.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Store is an in-memory [idempotency.TxStore], safe for concurrent use.
type Store struct {
	now     func() time.Time
	mu      sync.Mutex
	rows    map[string]*idempotency.Record
	pending map[string]*Tx
}

var _ idempotency.TxStore = (*Store)(nil)

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{now: opts.Now, rows: make(map[string]*idempotency.Record), pending: make(map[string]*Tx)}
}

// Tx is a memory transaction holding one key. Writes of the handler that
// must commit with the key are staged with [Tx.OnCommit].
type Tx struct {
	s      *Store
	c      idempotency.Claim
	done   chan struct{}
	mu     sync.Mutex
	hooks  []func()
	ending []func(committed bool)
	ended  bool
}

type txKey struct{}

// TxFrom returns the memory transaction in a handler's context.
func TxFrom(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Key returns the idempotency key the transaction holds.
func (tx *Tx) Key() string { return tx.c.Key }

// OnCommit stages f to run when the transaction commits, before the key is
// visible as completed; it does not run on rollback.
func (tx *Tx) OnCommit(f func()) {
	tx.mu.Lock()
	tx.hooks = append(tx.hooks, f)
	tx.mu.Unlock()
}

// OnEnd registers f to run after the transaction commits or rolls back (to
// release locks the handler took).
func (tx *Tx) OnEnd(f func(committed bool)) {
	tx.mu.Lock()
	tx.ending = append(tx.ending, f)
	tx.mu.Unlock()
}

// Context implements [idempotency.Tx].
func (tx *Tx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Commit implements [idempotency.Tx].
func (tx *Tx) Commit(ctx context.Context, r idempotency.Result) error {
	return tx.end(true, r)
}

// Rollback implements [idempotency.Tx].
func (tx *Tx) Rollback(ctx context.Context) error {
	return tx.end(false, idempotency.Result{})
}

func (tx *Tx) end(commit bool, r idempotency.Result) error {
	tx.mu.Lock()
	if tx.ended {
		tx.mu.Unlock()
		return nil
	}
	tx.ended = true
	hooks, ending := tx.hooks, tx.ending
	tx.mu.Unlock()
	if commit {
		for _, f := range hooks {
			f()
		}
	}
	s := tx.s
	s.mu.Lock()
	if commit {
		now := s.now()
		s.rows[tx.c.Key] = &idempotency.Record{
			Key: tx.c.Key, JobType: tx.c.JobType, Fingerprint: tx.c.Fingerprint,
			Status: idempotency.StatusCompleted, Result: copyResult(r),
			CompletedAt: now, ExpiresAt: now.Add(tx.c.Retention),
		}
	}
	delete(s.pending, tx.c.Key)
	close(tx.done)
	s.mu.Unlock()
	for _, f := range ending {
		f(commit)
	}
	return nil
}

// Begin implements [idempotency.TxStore]: a concurrent Begin of the same key
// waits for the holder to end.
func (s *Store) Begin(ctx context.Context, c idempotency.Claim) (idempotency.Tx, idempotency.Outcome, *idempotency.Record, error) {
	for {
		s.mu.Lock()
		if p := s.pending[c.Key]; p != nil {
			s.mu.Unlock()
			select {
			case <-p.done:
				continue
			case <-ctx.Done():
				return nil, 0, nil, ctx.Err()
			}
		}
		if rec := s.rows[c.Key]; rec != nil {
			out := idempotency.Completed
			if rec.Status == idempotency.StatusInProgress {
				out = idempotency.InProgress
			}
			cp := s.read(rec)
			s.mu.Unlock()
			return nil, out, &cp, nil
		}
		tx := &Tx{s: s, c: c, done: make(chan struct{})}
		s.pending[c.Key] = tx
		s.mu.Unlock()
		return tx, idempotency.Acquired, nil, nil
	}
}

// Claim implements [idempotency.Store].
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Outcome, *idempotency.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if p := s.pending[c.Key]; p != nil {
		return idempotency.InProgress, &idempotency.Record{
			Key: c.Key, JobType: p.c.JobType, Fingerprint: p.c.Fingerprint, Status: idempotency.StatusInProgress,
		}, nil
	}
	rec := s.rows[c.Key]
	if rec == nil {
		s.rows[c.Key] = &idempotency.Record{
			Key: c.Key, JobType: c.JobType, Fingerprint: c.Fingerprint, Status: idempotency.StatusInProgress,
			Owner: c.Owner, LockedUntil: now.Add(c.Lease), ExpiresAt: now.Add(c.Lease + c.Retention),
		}
		return idempotency.Acquired, nil, nil
	}
	if rec.Status == idempotency.StatusInProgress && !now.Before(rec.LockedUntil) && rec.Fingerprint == c.Fingerprint {
		rec.Owner = c.Owner
		rec.LockedUntil = now.Add(c.Lease)
		rec.ExpiresAt = now.Add(c.Lease + c.Retention)
		rec.Takeovers++
		return idempotency.TakenOver, nil, nil
	}
	cp := s.read(rec)
	if rec.Status == idempotency.StatusCompleted {
		return idempotency.Completed, &cp, nil
	}
	return idempotency.InProgress, &cp, nil
}

func (s *Store) owned(c idempotency.Claim) (*idempotency.Record, error) {
	rec := s.rows[c.Key]
	if rec == nil || rec.Status != idempotency.StatusInProgress || rec.Owner != c.Owner {
		return nil, idempotency.ErrClaimLost
	}
	return rec, nil
}

// Complete implements [idempotency.Store].
func (s *Store) Complete(ctx context.Context, c idempotency.Claim, r idempotency.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec := s.rows[c.Key]; rec != nil && rec.Status == idempotency.StatusCompleted && c.Owner != "" && rec.Owner == c.Owner {
		return nil // completed by this owner already: a retry
	}
	rec, err := s.owned(c)
	if err != nil {
		return err
	}
	now := s.now()
	rec.Status = idempotency.StatusCompleted
	rec.Result = copyResult(r)
	rec.LockedUntil = time.Time{}
	rec.CompletedAt = now
	rec.ExpiresAt = now.Add(c.Retention)
	return nil
}

// Release implements [idempotency.Store].
func (s *Store) Release(ctx context.Context, c idempotency.Claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.owned(c); err != nil {
		return err
	}
	delete(s.rows, c.Key)
	return nil
}

// Extend implements [idempotency.Store].
func (s *Store) Extend(ctx context.Context, c idempotency.Claim, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.owned(c)
	if err != nil {
		return err
	}
	rec.LockedUntil = s.now().Add(d)
	return nil
}

// Get implements [idempotency.Store].
func (s *Store) Get(ctx context.Context, key string) (*idempotency.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.rows[key]
	if rec == nil {
		return nil, idempotency.ErrNotFound
	}
	cp := s.read(rec)
	return &cp, nil
}

// read returns a copy of rec as a caller sees it, with the time its claim
// has left by the store's clock (LockedFor), and a result of its own: a
// caller that changes it must not change the stored one. s.mu is held.
func (s *Store) read(rec *idempotency.Record) idempotency.Record {
	cp := *rec
	cp.Result = copyResult(rec.Result)
	if rec.Status == idempotency.StatusInProgress && !rec.LockedUntil.IsZero() {
		cp.LockedFor = rec.LockedUntil.Sub(s.now())
	}
	return cp
}

// DeleteExpired implements [idempotency.Store]: rows past their retention,
// except live claims.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for k, rec := range s.rows {
		if n >= limit {
			break
		}
		if now.Before(rec.ExpiresAt) {
			continue
		}
		if rec.Status == idempotency.StatusInProgress && now.Before(rec.LockedUntil) {
			continue
		}
		delete(s.rows, k)
		n++
	}
	return n, nil
}

func copyResult(r idempotency.Result) idempotency.Result {
	if r.JSON != nil {
		r.JSON = append([]byte(nil), r.JSON...)
	}
	return r
}
