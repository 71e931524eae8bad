package optimistic

import (
	"math"
	"testing"
	"time"
)

// The bound of the wait doubles from Backoff, stops doubling at 64×Backoff,
// and stays positive (rand.N panics on a bound that is not) when doubling
// would overflow.
func TestBackoffCeiling(t *testing.T) {
	r := Retrier{Backoff: time.Millisecond}
	for n, want := range map[int]time.Duration{1: time.Millisecond, 2: 2 * time.Millisecond, 3: 4 * time.Millisecond,
		7: 64 * time.Millisecond, 8: 64 * time.Millisecond, 1000: 64 * time.Millisecond} {
		if got := r.backoffCeiling(n); got != want {
			t.Errorf("backoffCeiling(%d) = %v, want %v", n, got, want)
		}
	}
	huge := Retrier{Backoff: math.MaxInt64 / 3}
	for n := 1; n <= 10; n++ {
		if got := huge.backoffCeiling(n); got <= 0 || got < huge.Backoff {
			t.Errorf("huge Backoff: backoffCeiling(%d) = %v, want positive, at least Backoff", n, got)
		}
	}
}
