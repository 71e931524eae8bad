package sdk

import (
	"math"
	"time"
)

// Backoff computes retry delays: min(Max, Base·2^(attempt-1)) plus a jitter
// drawn uniformly in [0, Jitter·delay]. The zero value uses the defaults
// (Base 1s, Max 5m, Jitter 0.2). [NewWorker] refuses a negative Base or
// Max in a [RetryPolicy]; Delay takes them as zero.
type Backoff struct {
	// Base is the first delay. Zero means 1s.
	Base time.Duration
	// Max caps the delay before jitter, even below Base. Zero means 5m, or
	// Base when Base is longer.
	Max    time.Duration
	Jitter float64 // fraction of the delay; negative means none
}

// DefaultBackoff is the Backoff used when none is given.
var DefaultBackoff = Backoff{Base: time.Second, Max: 5 * time.Minute, Jitter: 0.2}

func (b Backoff) withDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = DefaultBackoff.Base
	}
	if b.Max <= 0 {
		// Only a default Max gives way to a longer Base: a Max that was
		// set is the cap the formula promises.
		b.Max = max(DefaultBackoff.Max, b.Base)
	}
	if b.Jitter == 0 {
		b.Jitter = DefaultBackoff.Jitter
	}
	return b
}

// Delay returns the delay before the retry that follows attempt (1-based),
// with u, a number in [0, 1), choosing the jitter. Given the same u it is
// deterministic. It is never negative: a sum beyond the largest Duration is
// that Duration.
func (b Backoff) Delay(attempt int, u float64) time.Duration {
	b = b.withDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := b.Max
	if exp := attempt - 1; exp < 62 {
		if f := float64(b.Base) * math.Pow(2, float64(exp)); f < float64(b.Max) {
			d = time.Duration(f)
		}
	}
	if u < 0 {
		u = 0
	}
	if u >= 1 {
		u = math.Nextafter(1, 0)
	}
	// The jitter saturates rather than overflow: a huge Max (math.MaxInt64
	// for "no cap") or Jitter would otherwise wrap to a negative delay,
	// which brokers take as "retry now". A NaN Jitter is none.
	j := b.Jitter * u * float64(d)
	if !(j > 0) {
		return d
	}
	if j >= math.MaxInt64 || time.Duration(j) > math.MaxInt64-d {
		return math.MaxInt64
	}
	return d + time.Duration(j)
}
