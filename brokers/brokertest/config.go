package brokertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// warnings is a slog.Handler that keeps the "check" attribute of every
// record at Warn or above (the conflicts NewWorker logs).
type warnings struct {
	mu     sync.Mutex
	checks []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "check" {
			w.mu.Lock()
			w.checks = append(w.checks, a.Value.String())
			w.mu.Unlock()
		}
		return true
	})
	return nil
}

func (w *warnings) has(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.checks {
		if c == id {
			return true
		}
	}
	return false
}

// testWorkerMaxAttemptsOverCap is issue 14's repro: a Worker whose
// MaxAttempts is above the broker's poison cap. A broker that reports its cap
// (sdk.DeliveryCapReporter) makes NewWorker refuse the options under
// StrictConfig and warn about them otherwise; either way the job is
// dead-lettered with the handler's last error, never "max deliveries
// exceeded", after min(MaxAttempts, cap) runs.
func testWorkerMaxAttemptsOverCap(t *testing.T, e *env) {
	limit := 0
	if cr, ok := e.b.(sdk.DeliveryCapReporter); ok {
		limit = cr.MaxDeliveries()
		if e.supports(CapMaxDeliveries) && limit != e.h.MaxDeliveries {
			t.Errorf("MaxDeliveries() = %d, want the harness's cap %d", limit, e.h.MaxDeliveries)
		}
	}
	maxAttempts := max(e.h.MaxDeliveries, 3) + 2
	opts := sdk.WorkerOptions{
		Queue:       e.q,
		Concurrency: 1,
		Lease:       e.h.Lease,
		Retry: sdk.RetryPolicy{
			MaxAttempts: maxAttempts,
			Backoff:     sdk.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond},
		},
		DrainTimeout: e.h.Timeout / 2,
		Rand:         rand.New(rand.NewPCG(14, 1)),
	}

	conflicts, err := sdk.CheckConfig(e.b, opts)
	if err != nil {
		t.Fatalf("CheckConfig: %v", err)
	}
	found := false
	for _, c := range conflicts {
		found = found || c.ID == sdk.ConflictMaxAttemptsOverCap
	}
	if found != (limit > 0) {
		t.Errorf("CheckConfig with MaxAttempts %d, broker cap %d: conflict reported %v, want %v (%v)", maxAttempts, limit, found, limit > 0, conflicts)
	}
	strict := opts
	strict.StrictConfig = true
	strict.Logger = slog.New(slog.DiscardHandler)
	_, err = sdk.NewWorker(e.b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), strict)
	var cerr *sdk.ConfigError
	if limit > 0 && (!errors.Is(err, sdk.ErrConfigConflict) || !errors.As(err, &cerr)) {
		t.Errorf("NewWorker with StrictConfig, MaxAttempts %d over the broker's cap %d: %v, want a *ConfigError", maxAttempts, limit, err)
	}
	if limit == 0 && err != nil {
		t.Errorf("NewWorker with StrictConfig on a broker without a cap on retries: %v", err)
	}

	m := textMessage("over the cap")
	e.publish(t, m)
	var runs atomic.Int32
	handler := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		runs.Add(1)
		return fmt.Errorf("brokertest: the real error, attempt %d", d.Attempt())
	})
	warned := &warnings{}
	obs := newSettlements()
	opts.Logger = slog.New(warned)
	opts.Observers = []sdk.Observer{obs}
	w, err := sdk.NewWorker(e.b, handler, opts)
	if err != nil {
		t.Fatalf("NewWorker without StrictConfig: %v", err)
	}
	if limit > 0 && !warned.has(sdk.ConflictMaxAttemptsOverCap) {
		t.Errorf("NewWorker did not log the conflict %s", sdk.ConflictMaxAttemptsOverCap)
	}
	stop := startWorker(t, w)
	obs.waitFinals(t, 1, e.h.Timeout)
	stop()

	want := maxAttempts
	if limit > 0 {
		want = min(maxAttempts, limit)
	}
	if got := int(runs.Load()); got != want {
		t.Errorf("handler ran %d times, want %d (MaxAttempts %d, broker cap %d)", got, want, maxAttempts, limit)
	}
	if !e.supports(CapDeadLetters) {
		return
	}
	dead := e.waitDeadLetters(t, 1)[0]
	reason := fmt.Sprintf("brokertest: the real error, attempt %d", want)
	if got := dead.Header(sdk.HeaderDeadLetterReason); got != reason {
		t.Errorf("%s = %q, want the handler's last error %q", sdk.HeaderDeadLetterReason, got, reason)
	}
	if got := dead.Header(sdk.HeaderDeadLetterClass); got != string(sdk.ClassTransient) {
		t.Errorf("%s = %q, want %q", sdk.HeaderDeadLetterClass, got, sdk.ClassTransient)
	}
}
