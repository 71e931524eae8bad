package outbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
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
