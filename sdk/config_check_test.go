package sdk_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// cappedSub is a fakeSub that reports a lease and a poison cap.
type cappedSub struct {
	*fakeSub
	lease time.Duration
	limit int
}

func (s cappedSub) Lease() time.Duration { return s.lease }
func (s cappedSub) MaxDeliveries() int   { return s.limit }

func ids(cs []sdk.ConfigConflict) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
		if c.Type != "" {
			out[i] += "[" + c.Type + "]"
		}
	}
	return out
}

func TestCheckConfig(t *testing.T) {
	sub := cappedSub{fakeSub: newFakeSub(), lease: 30 * time.Second, limit: 5}
	cases := map[string]struct {
		sub  sdk.Subscriber
		opts sdk.WorkerOptions
		want string
	}{
		"defaults":                         {sub, sdk.WorkerOptions{}, ""},
		"max attempts at the cap":          {sub, sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 5}}, ""},
		"max attempts 8 over the cap 5":    {sub, sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 8}}, sdk.ConflictMaxAttemptsOverCap},
		"a type over the cap":              {sub, sdk.WorkerOptions{RetryByType: map[string]sdk.RetryPolicy{"a": {MaxAttempts: 3}, "b": {MaxAttempts: 6}}}, sdk.ConflictMaxAttemptsOverCap + "[b]"},
		"no cap reported":                  {newFakeSub(), sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 100}}, ""},
		"cap disabled":                     {cappedSub{fakeSub: newFakeSub(), lease: time.Minute}, sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 100}}, ""},
		"worker lease 3x the broker's":     {sub, sdk.WorkerOptions{Lease: 90 * time.Second}, sdk.ConflictHeartbeatOverLease},
		"heartbeat fits the broker's":      {sub, sdk.WorkerOptions{Lease: 90 * time.Second, HeartbeatInterval: 10 * time.Second}, ""},
		"no heartbeat, default timeout":    {sub, sdk.WorkerOptions{HeartbeatInterval: -1}, sdk.ConflictTimeoutOverLease},
		"no heartbeat, short timeout":      {sub, sdk.WorkerOptions{HeartbeatInterval: -1, Timeout: 20 * time.Second}, ""},
		"no heartbeat, no timeout":         {sub, sdk.WorkerOptions{HeartbeatInterval: -1, Timeout: -1}, sdk.ConflictTimeoutOverLease},
		"no heartbeat, a type's timeout":   {sub, sdk.WorkerOptions{HeartbeatInterval: -1, Timeout: 20 * time.Second, TimeoutByType: map[string]time.Duration{"slow": time.Hour}}, sdk.ConflictTimeoutOverLease + "[slow]"},
		"no heartbeat, no lease reporter":  {newFakeSub(), sdk.WorkerOptions{HeartbeatInterval: -1}, ""},
		"heartbeat on, timeout of an hour": {sub, sdk.WorkerOptions{Timeout: time.Hour}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.opts.Queue = "q"
			got, err := sdk.CheckConfig(tc.sub, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if g := strings.Join(ids(got), ","); g != tc.want {
				t.Errorf("conflicts %q, want %q (%v)", g, tc.want, got)
			}
			for _, c := range got {
				if c.Message == "" || c.Fix == "" {
					t.Errorf("conflict %s without message or fix: %+v", c.ID, c)
				}
			}
		})
	}
	if _, err := sdk.CheckConfig(sub, sdk.WorkerOptions{}); err == nil {
		t.Error("CheckConfig without a queue: no error")
	}
}

func TestNewWorkerStrictConfig(t *testing.T) {
	sub := cappedSub{fakeSub: newFakeSub(), lease: 30 * time.Second, limit: 5}
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	opts := sdk.WorkerOptions{Queue: "q", Retry: sdk.RetryPolicy{MaxAttempts: 8}, StrictConfig: true, Logger: quiet}
	_, err := sdk.NewWorker(sub, h, opts)
	var cerr *sdk.ConfigError
	if !errors.Is(err, sdk.ErrConfigConflict) || !errors.As(err, &cerr) || len(cerr.Conflicts) != 1 {
		t.Fatalf("NewWorker: %v, want a *ConfigError with one conflict", err)
	}
	if !strings.Contains(err.Error(), "Retry.MaxAttempts is 8") {
		t.Errorf("error %q does not name the setting", err)
	}
	opts.StrictConfig = false
	if _, err := sdk.NewWorker(sub, h, opts); err != nil {
		t.Fatalf("NewWorker without StrictConfig: %v", err)
	}
}

// TestWorkerDeadLettersAtBrokerCap: with MaxAttempts 8 over a broker cap of
// 5, the Worker dead-letters the fifth attempt itself, with the handler's
// error, where the broker would have dead-lettered the sixth delivery with
// "max deliveries exceeded".
func TestWorkerDeadLettersAtBrokerCap(t *testing.T) {
	real := errors.New("payment API: card declined by issuer (transient?)")
	cases := []struct {
		name    string
		attempt int
		err     error
		want    string
	}{
		{"below the cap retries", 4, real, "retry"},
		{"at the cap dead-letters", 5, real, "dead_letter"},
		{"retry-after below the cap retries", 4, sdk.RetryAfter(real, time.Second), "retry"},
		{"retry-after at the cap dead-letters on a broker that cannot release", 5, sdk.RetryAfter(real, time.Second), "dead_letter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub := cappedSub{fakeSub: newFakeSub(), lease: 30 * time.Second, limit: 5}
			f := newFake(tc.attempt, "job")
			h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return tc.err })
			stop := runWorker(t, sub, h, sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 8}})
			sub.ch <- f.WithoutRelease()
			waitSettled(t, f)
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if a := actions(f); len(a) != 1 || a[0] != tc.want {
				t.Fatalf("actions %v, want [%s]", a, tc.want)
			}
			if !errors.Is(first(f).Cause, real) {
				t.Errorf("cause %v, want the handler's error", first(f).Cause)
			}
		})
	}
	t.Run("a releaser is released at the cap", func(t *testing.T) {
		sub := cappedSub{fakeSub: newFakeSub(), lease: 30 * time.Second, limit: 5}
		f := newFake(5, "job")
		h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return sdk.RetryAfter(real, time.Second) })
		stop := runWorker(t, sub, h, sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 8}})
		sub.ch <- f
		waitSettled(t, f)
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if a := actions(f); len(a) != 1 || a[0] != "release" {
			t.Fatalf("actions %v, want [release]", a)
		}
	})
}
