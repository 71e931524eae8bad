package sdk

import (
	"testing"
	"time"
)

// TestRetryByTypeBackoffCaps: a RetryByType entry that sets only Max gets
// delays capped at it, though the Base it inherits is longer; one that sets
// only a Base longer than the inherited Max gets that Base, as a Backoff
// with only such a Base does. The first got the inherited Base (1s by
// default) as its delay: its Max was raised to Base.
func TestRetryByTypeBackoffCaps(t *testing.T) {
	o, err := WorkerOptions{Queue: "q", RetryByType: map[string]RetryPolicy{
		"fast": {Backoff: Backoff{Max: 100 * time.Millisecond, Jitter: -1}},
		"slow": {Backoff: Backoff{Base: 10 * time.Minute, Jitter: -1}},
	}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for typ, want := range map[string]time.Duration{"fast": 100 * time.Millisecond, "slow": 10 * time.Minute} {
		for _, attempt := range []int{1, 3} {
			if got := o.RetryByType[typ].Backoff.Delay(attempt, 0); got != want {
				t.Errorf("RetryByType[%q] delay at attempt %d = %v, want %v", typ, attempt, got, want)
			}
		}
	}
	// Without a Max, a Base beyond the default Max is the delay.
	if got := (Backoff{Base: 10 * time.Minute, Jitter: -1}).Delay(2, 0); got != 10*time.Minute {
		t.Errorf("Backoff{Base: 10m}.Delay(2) = %v, want 10m", got)
	}
}
