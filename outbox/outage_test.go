package outbox_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRelayOutageLoggedOnce: with PostgreSQL unreachable (a fault proxy
// that resets the relay's connections and refuses new ones), the relay keeps
// polling, with backoff, but logs the outage once when it starts (and at most
// every OutageLogInterval after), not at every poll, and once when it ends;
// it then publishes again. Before, every PollInterval logged a warning.
func TestRelayOutageLoggedOnce(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	u, proxy := integration.ProxyURL(t, integration.PostgresDSN(t))
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64 // the relay's connection attempts: one per poll while the database is unreachable
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { dials.Add(1); return nil }
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	relayPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer relayPool.Close()
	relayBox, err := outbox.New(relayPool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}

	logs := &records{}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- relayBox.Relay(rctx, b, outbox.RelayOptions{
			PollInterval: time.Millisecond, // the outage backoff starts there and doubles
			Logger:       slog.New(logs),
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Relay: %v", err)
		}
	}()
	add(t, pool, box, "q", &sdk.Message{Type: "x"})
	drain(t, b, "q", 1)
	waitFor(t, func() bool { n, err := box.Pending(ctx); return err == nil && n == 0 }, "the relay to record its publish")

	proxy.Refuse(true)
	proxy.Reset()
	start := time.Now()
	from := dials.Load()
	const polls = 8
	waitFor(t, func() bool { return dials.Load() >= from+polls }, "the relay to poll the unreachable database")
	outage := time.Since(start)
	// One line when it started, at most one more per OutageLogInterval.
	limit := 1 + int(outage/time.Minute) // outbox.OutageLogInterval
	warned := len(logs.at(slog.LevelWarn, "")) + len(logs.at(slog.LevelError, ""))
	if warned == 0 || warned > limit {
		for _, r := range append(logs.at(slog.LevelWarn, ""), logs.at(slog.LevelError, "")...) {
			t.Log(r.Message, attr(r, "err"))
		}
		t.Fatalf("%d WARN/ERROR lines over %d failed polls in %s of outage; want 1 to %d", warned, dials.Load()-from, outage, limit)
	}

	proxy.Refuse(false)
	m := &sdk.Message{Type: "x"}
	add(t, pool, box, "q", m)
	if got := drain(t, b, "q", 1); got[m.ID] == nil {
		t.Fatalf("after the outage: %v", got)
	}
	waitFor(t, func() bool { return len(logs.at(slog.LevelInfo, "read again")) > 0 }, "the end of the outage to be logged")
	if n := len(logs.at(slog.LevelInfo, "read again")); n != 1 {
		t.Fatalf("the end of the outage logged %d times, want 1", n)
	}
}

// waitFor polls cond until it holds, failing the test after
// berthtest.WaitTimeout.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(berthtest.WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
