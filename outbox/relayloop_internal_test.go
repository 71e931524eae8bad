package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// fakeClock moves only when the relay loop waits, and gives the jitter u.
type fakeClock struct {
	now   time.Time
	u     float64
	waits []time.Duration
}

func (c *fakeClock) Now() time.Time   { return c.now }
func (c *fakeClock) Float64() float64 { return c.u }
func (c *fakeClock) Wait(ctx context.Context, d time.Duration) bool {
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	return ctx.Err() == nil
}

type logged struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logged) Enabled(context.Context, slog.Level) bool { return true }
func (h *logged) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logged) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logged) WithGroup(string) slog.Handler      { return h }

// TestRelayLoopOutageBackoff: while every pass fails on the database, the
// loop waits OutageBackoff's capped, jittered, growing delays (not
// PollInterval), logs the outage once when it starts, then at most every
// OutageLogInterval, and once when it ends, after which it polls every
// PollInterval again. Time is a fake clock that moves by the waits.
func TestRelayLoopOutageBackoff(t *testing.T) {
	for _, u := range []float64{0, 0.999} {
		logs := &logged{}
		opts := RelayOptions{Logger: slog.New(logs)}.withDefaults()
		clock := &fakeClock{now: time.Unix(1e9, 0), u: u}
		const outage = 300 // failed passes
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		pass := func(context.Context) (int, error) {
			calls++
			switch {
			case calls <= outage:
				return 0, &dbError{errors.New("connection refused")}
			case calls == outage+2:
				cancel()
			}
			return 0, nil
		}
		(&Outbox{table: `"t"`}).relayLoop(ctx, opts, pass, clock)
		cancel()

		if len(clock.waits) != outage+1 {
			t.Fatalf("u=%v: %d waits, want %d", u, len(clock.waits), outage+1)
		}
		var total time.Duration
		ceiling := time.Duration(float64(DefaultOutageMax) * (1 + opts.OutageBackoff.Jitter))
		for i, d := range clock.waits[:outage] {
			if want := opts.OutageBackoff.Delay(i+1, u); d != want {
				t.Fatalf("u=%v: wait after failure %d: %s, want OutageBackoff's %s", u, i+1, d, want)
			}
			if d > ceiling || (i > 0 && d < clock.waits[i-1]) {
				t.Fatalf("u=%v: wait after failure %d: %s (before %s); want growing, at most %s", u, i+1, d, clock.waits[max(i-1, 0)], ceiling)
			}
			total += d
		}
		if first, last := clock.waits[0], clock.waits[outage-1]; first != opts.OutageBackoff.Delay(1, u) || last < DefaultOutageMax {
			t.Fatalf("u=%v: waits from %s to %s; want from about PollInterval up to the cap %s", u, first, last, DefaultOutageMax)
		}
		if d := clock.waits[outage]; d != opts.PollInterval {
			t.Fatalf("u=%v: wait after the recovery %s, want PollInterval %s", u, d, opts.PollInterval)
		}
		var warns, infos []slog.Record
		for _, r := range logs.recs {
			switch r.Level {
			case slog.LevelWarn:
				warns = append(warns, r)
			case slog.LevelInfo:
				infos = append(infos, r)
			default:
				t.Errorf("u=%v: unexpected log %s %q", u, r.Level, r.Message)
			}
		}
		// One when it starts; then one per OutageLogInterval of the outage
		// at most (the last wait is after the last failure).
		most := 1 + int((total-clock.waits[outage-1])/OutageLogInterval)
		if len(warns) < 2 || len(warns) > most || !strings.Contains(warns[0].Message, "cannot read") {
			t.Fatalf("u=%v: %d warnings over %s of outage; want the start, then at most one a minute (%d in all)", u, len(warns), total, most)
		}
		if len(infos) != 1 || !strings.Contains(infos[0].Message, "read again") {
			t.Fatalf("u=%v: info logs %v; want one saying the table can be read again", u, infos)
		}
	}
}

// TestOutageBackoffFieldDefaults: an OutageBackoff with only some fields
// set takes the relay's defaults for the others (Base PollInterval, Max
// DefaultOutageMax), as its doc says. Before, any field set made the others
// sdk's (Base 1s, Max 5m): a relay that only turned the jitter off could
// wait five minutes after the database came back.
func TestOutageBackoffFieldDefaults(t *testing.T) {
	opts := RelayOptions{PollInterval: 50 * time.Millisecond, OutageBackoff: sdk.Backoff{Jitter: -1}}.withDefaults()
	if d := opts.OutageBackoff.Delay(1, 0.5); d != opts.PollInterval {
		t.Errorf("first outage wait %s, want PollInterval %s", d, opts.PollInterval)
	}
	if d := opts.OutageBackoff.Delay(100, 0.5); d != DefaultOutageMax {
		t.Errorf("outage wait after 100 failures %s, want the cap %s (no jitter)", d, DefaultOutageMax)
	}
	opts = RelayOptions{OutageBackoff: sdk.Backoff{Base: time.Minute}}.withDefaults()
	if d := opts.OutageBackoff.Delay(100, 0); d != time.Minute {
		t.Errorf("a Base above DefaultOutageMax: wait %s, want the Base %s as cap", d, time.Minute)
	}
}

// TestRelayLoopBacksOffAfterLostRecords: while pass after pass publishes
// and the database loses its record (ErrPublishNotRecorded: the same rows
// go out again at each), the loop waits OutageBackoff's growing delays, not
// PollInterval, and returns to PollInterval after a pass that recorded.
// Before, a lasting cause (a transaction_timeout shorter than the publish)
// republished the batch every PollInterval.
func TestRelayLoopBacksOffAfterLostRecords(t *testing.T) {
	opts := RelayOptions{Logger: slog.New(&logged{})}.withDefaults()
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	const lost = 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	pass := func(context.Context) (int, error) {
		calls++
		switch {
		case calls <= lost:
			return 0, fmt.Errorf("%w (3 published): terminated", ErrPublishNotRecorded)
		case calls == lost+2:
			cancel()
		}
		return 0, nil
	}
	(&Outbox{table: `"t"`}).relayLoop(ctx, opts, pass, clock)
	if len(clock.waits) != lost+1 {
		t.Fatalf("%d waits, want %d", len(clock.waits), lost+1)
	}
	for i, d := range clock.waits[:lost] {
		if want := opts.OutageBackoff.Delay(i+1, 0); d != want {
			t.Fatalf("wait after lost record %d: %s, want OutageBackoff's %s", i+1, d, want)
		}
	}
	if last := clock.waits[lost-1]; last < 10*opts.PollInterval {
		t.Fatalf("after %d lost records in a row the relay waits %s; want it backed off well past PollInterval %s", lost, last, opts.PollInterval)
	}
	if d := clock.waits[lost]; d != opts.PollInterval {
		t.Fatalf("wait after a recorded pass %s, want PollInterval %s", d, opts.PollInterval)
	}
}
