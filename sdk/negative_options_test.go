package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestNewWorkerRefusesNegativeOptions: a negative value where zero means
// the default is a configuration bug (a sign error, a bad subtraction);
// NewWorker and CheckConfig refuse it with an error matching
// ErrInvalidOptions that names the field, rather than quietly running with
// the default. Before, a negative MaxAttempts (Worker's or a type's),
// Backoff.Base or Max, QueueIdleWait, DrainTimeout or SettleTimeout was
// taken for zero: MaxAttempts -1 dead-lettered at attempt 5.
func TestNewWorkerRefusesNegativeOptions(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	neg := func(p sdk.RetryPolicy) map[string]sdk.RetryPolicy { return map[string]sdk.RetryPolicy{"billing": p} }
	for field, o := range map[string]sdk.WorkerOptions{
		"Retry.MaxAttempts":                   {Retry: sdk.RetryPolicy{MaxAttempts: -1}},
		"Retry.Backoff.Base":                  {Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Base: -time.Second}}},
		"Retry.Backoff.Max":                   {Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Max: -time.Second}}},
		`RetryByType["billing"].MaxAttempts`:  {RetryByType: neg(sdk.RetryPolicy{MaxAttempts: -3})},
		`RetryByType["billing"].Backoff.Base`: {RetryByType: neg(sdk.RetryPolicy{Backoff: sdk.Backoff{Base: -1}})},
		`RetryByType["billing"].Backoff.Max`:  {RetryByType: neg(sdk.RetryPolicy{Backoff: sdk.Backoff{Max: -1}})},
		"QueueIdleWait":                       {QueueIdleWait: -time.Second},
		"DrainTimeout":                        {DrainTimeout: -time.Second},
		"SettleTimeout":                       {SettleTimeout: -time.Second},
		"Lease":                               {Lease: -time.Second},
		"Concurrency":                         {Concurrency: -1},
		"Prefetch":                            {Prefetch: -1},
		"ReceiveLoops":                        {ReceiveLoops: -1},
		"HeartbeatInterval 1s is longer than half the Lease": {Lease: time.Second, HeartbeatInterval: time.Second},
	} {
		o.Queue, o.Logger = "q", quiet
		_, err := sdk.NewWorker(newFakeSub(), h, o)
		if !errors.Is(err, sdk.ErrInvalidOptions) || !strings.Contains(fmt.Sprint(err), field) {
			t.Errorf("%s: NewWorker = %v; want ErrInvalidOptions naming %s", field, err, field)
		}
		if _, err := sdk.CheckConfig(newFakeSub(), o); !errors.Is(err, sdk.ErrInvalidOptions) {
			t.Errorf("%s: CheckConfig = %v; want ErrInvalidOptions", field, err)
		}
	}
	if _, err := sdk.NewWorker(nil, h, sdk.WorkerOptions{Queue: "q"}); !errors.Is(err, sdk.ErrInvalidOptions) {
		t.Errorf("nil subscriber: %v; want ErrInvalidOptions", err)
	}
	// Zero still means the default, and the documented negatives still mean
	// "none".
	if _, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Logger: quiet, Timeout: -1,
		TimeoutByType: map[string]time.Duration{"x": -1}, HeartbeatInterval: -1,
		Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Jitter: -1}}, RetryByType: neg(sdk.RetryPolicy{})}); err != nil {
		t.Errorf("zero and documented negative options refused: %v", err)
	}
}

// TestZeroMaxAttemptsStillDefaults: MaxAttempts zero (the Worker's, and a
// type's inheriting it) is DefaultMaxAttempts: the job is retried until
// attempt 5 and dead-lettered there.
func TestZeroMaxAttemptsStillDefaults(t *testing.T) {
	sub := newFakeSub()
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return errors.New("transient") }),
		sdk.WorkerOptions{Queue: "q", Logger: quiet, RetryByType: map[string]sdk.RetryPolicy{"typed": {}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"plain", "typed"} {
		for attempt, want := range map[int]sdk.Action{sdk.DefaultMaxAttempts - 1: sdk.ActionRetry, sdk.DefaultMaxAttempts: sdk.ActionDeadLetter} {
			if s := w.Process(context.Background(), newFake(attempt, typ)); s.Action != want {
				t.Errorf("%s at attempt %d: %s, want %s", typ, attempt, s.Action, want)
			}
		}
	}
}
