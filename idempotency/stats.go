package idempotency

import (
	"context"
	"sync/atomic"
)

// Event names what the guard did with one delivery or inbox event, for
// [Stats] and [Observer].
type Event string

// The events.
const (
	// EventExecuted: the handler ran and its result was stored.
	EventExecuted Event = "executed"
	// EventDuplicate: the key was completed; acked without running the handler.
	EventDuplicate Event = "duplicate_suppressed"
	// EventCacheHit: a duplicate recognised by the cache alone (also counted
	// as EventDuplicate).
	EventCacheHit Event = "cache_hit"
	// EventConflict: same key, different payload; dead-lettered.
	EventConflict Event = "key_conflict"
	// EventInProgress: the key was claimed elsewhere; retried later.
	EventInProgress Event = "in_progress_collision"
	// EventTakeover: an expired claim was taken over.
	EventTakeover Event = "lease_takeover"
	// EventClaimLost: a claim expired and was taken over before completion.
	EventClaimLost Event = "claim_lost"
	// EventMissingKey: a message without a key was rejected.
	EventMissingKey Event = "missing_key"
	// EventCacheError: the cache failed; the durable store was used.
	EventCacheError Event = "cache_error"
)

// Observer is told of every guard event; telemetry adapts it to metrics.
// Observe is called from many goroutines at once and must be quick.
type Observer interface {
	Observe(ctx context.Context, e Event, jobType string)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(ctx context.Context, e Event, jobType string)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event, jobType string) { f(ctx, e, jobType) }

// Stats counts guard events. Its zero value is ready; share one between
// middlewares to aggregate. Read it with [Stats.Snapshot].
type Stats struct {
	executed, duplicates, cacheHits, conflicts, inProgress, takeovers, claimsLost, missingKeys, cacheErrors atomic.Int64
}

// StatsSnapshot is a copy of the counters at one moment.
type StatsSnapshot struct {
	Executed             int64
	DuplicatesSuppressed int64
	CacheHits            int64
	KeyConflicts         int64
	InProgressCollisions int64
	LeaseTakeovers       int64
	ClaimsLost           int64
	MissingKeys          int64
	CacheErrors          int64
}

// Snapshot returns the current counts.
func (s *Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{
		Executed:             s.executed.Load(),
		DuplicatesSuppressed: s.duplicates.Load(),
		CacheHits:            s.cacheHits.Load(),
		KeyConflicts:         s.conflicts.Load(),
		InProgressCollisions: s.inProgress.Load(),
		LeaseTakeovers:       s.takeovers.Load(),
		ClaimsLost:           s.claimsLost.Load(),
		MissingKeys:          s.missingKeys.Load(),
		CacheErrors:          s.cacheErrors.Load(),
	}
}

// Observe counts e; it makes *Stats an [Observer].
func (s *Stats) Observe(_ context.Context, e Event, _ string) {
	switch e {
	case EventExecuted:
		s.executed.Add(1)
	case EventDuplicate:
		s.duplicates.Add(1)
	case EventCacheHit:
		s.cacheHits.Add(1)
	case EventConflict:
		s.conflicts.Add(1)
	case EventInProgress:
		s.inProgress.Add(1)
	case EventTakeover:
		s.takeovers.Add(1)
	case EventClaimLost:
		s.claimsLost.Add(1)
	case EventMissingKey:
		s.missingKeys.Add(1)
	case EventCacheError:
		s.cacheErrors.Add(1)
	}
}
