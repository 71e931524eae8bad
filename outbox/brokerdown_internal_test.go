package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// downThenUp fails every publish as a broker that is down until up is
// set, then takes them.
type downThenUp struct {
	mu        sync.Mutex
	up        bool
	published int
}

func (p *downThenUp) Publish(_ context.Context, _ string, msgs ...*sdk.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		return fmt.Errorf("%w: connection refused", sdk.ErrUnavailable)
	}
	p.published += len(msgs)
	return nil
}

// TestRelayLoopBacksOffWhileBrokerDown: while the broker is down (every
// publish of a pass fails with sdk.ErrUnavailable) and the outbox holds a
// backlog, the relay paces its passes with OutageBackoff and logs the
// outage once when it starts (then at most once a minute) and once when it
// ends. Before, each pass only postponed its own rows, so with a backlog
// the next pass took the next batch after PollInterval: for the whole
// outage, a failed publish of BatchSize rows, their UPDATE and a WARN
// every 200 ms (a 5-second outage over 20,000 rows: 2,400 row updates and
// 24 warnings). Real PostgreSQL, a fake clock.
func TestRelayLoopBacksOffWhileBrokerDown(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("outbox_test_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	box, err := New(pool, Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+box.table+` (queue, message_id) SELECT 'q', 'm-' || g FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}

	logs := &logged{}
	opts := RelayOptions{BatchSize: 10, Logger: slog.New(logs)}.withDefaults()
	clock := &fakeClock{now: time.Unix(1e9, 0)} // no jitter
	pub := &downThenUp{}
	const down = 30 // passes while the broker is down: 300 of the 1,000 rows tried
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	calls := 0
	pass := func(ctx context.Context) (int, error) {
		calls++
		switch calls {
		case down + 1:
			pub.mu.Lock()
			pub.up = true
			pub.mu.Unlock()
		case down + 2:
			cancel()
			return 0, nil
		}
		return box.RelayOnce(ctx, pub, opts)
	}
	if err := box.relayLoop(rctx, opts, pass, clock); err != nil {
		t.Fatal(err)
	}
	if len(clock.waits) != down+1 {
		t.Fatalf("%d waits, want %d", len(clock.waits), down+1)
	}
	var total time.Duration
	for i, d := range clock.waits[:down] {
		if want := opts.OutageBackoff.Delay(i+1, 0); d != want {
			t.Fatalf("wait after broker-down pass %d: %s, want OutageBackoff's %s (waits %v)", i+1, d, want, clock.waits)
		}
		total += d
	}
	if d := clock.waits[down]; d > opts.PollInterval {
		t.Errorf("wait after the broker took a batch again: %s, want PollInterval %s at most", d, opts.PollInterval)
	}
	pub.mu.Lock()
	published := pub.published
	pub.mu.Unlock()
	if published != opts.BatchSize {
		t.Errorf("%d rows published once the broker was back, want a batch (%d)", published, opts.BatchSize)
	}
	var warns, infos []string
	for _, r := range logs.recs {
		switch r.Level {
		case slog.LevelWarn:
			warns = append(warns, r.Message)
		case slog.LevelInfo:
			infos = append(infos, r.Message)
		}
	}
	most := 1 + int((total-clock.waits[down-1])/OutageLogInterval)
	if len(warns) == 0 || len(warns) > most || !strings.Contains(warns[0], "broker") {
		t.Errorf("%d warnings over %s of broker outage (%d passes), want the start then at most one a minute (%d in all): %q",
			len(warns), total, down, most, warns)
	}
	if len(infos) != 1 || !strings.Contains(infos[0], "broker") {
		t.Errorf("info logs %q; want one saying the broker takes messages again", infos)
	}
}

// TestRelayLoopOutageEndsWithNothingToTry: a pass with nothing to try (the
// rows parked or discarded by an operator meanwhile) ends a broker outage
// as far as the relay knows, so the next one starts its backoff at the
// first step and warns at its start. Before, only a pass that published
// reset it: the next outage began near the 30 s cap, with no warning at
// its start, and was later logged as lasting since the first.
func TestRelayLoopOutageEndsWithNothingToTry(t *testing.T) {
	logs := &logged{}
	opts := RelayOptions{Logger: slog.New(logs)}.withDefaults()
	clock := &fakeClock{now: time.Unix(1e9, 0)} // no jitter
	o := &Outbox{table: "t"}
	downErr := &brokerDownError{fmt.Errorf("%w: connection refused", sdk.ErrUnavailable)}
	results := []error{downErr, downErr, downErr, nil, downErr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	pass := func(context.Context) (int, error) {
		if calls == len(results) {
			cancel()
			return 0, nil
		}
		err := results[calls]
		calls++
		return 0, err
	}
	if err := o.relayLoop(ctx, opts, pass, clock); err != nil {
		t.Fatal(err)
	}
	if len(clock.waits) < len(results) {
		t.Fatalf("%d waits, want %d at least: %v", len(clock.waits), len(results), clock.waits)
	}
	if got, want := clock.waits[4], opts.OutageBackoff.Delay(1, 0); got != want {
		t.Errorf("wait after the new outage's first pass: %s, want OutageBackoff's first step %s (waits %v)", got, want, clock.waits)
	}
	starts := 0
	for _, r := range logs.recs {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, "the broker is unavailable") {
			starts++
		}
	}
	if starts != 2 {
		t.Errorf("%d outage-start warnings, want 2 (one an outage)", starts)
	}
}
