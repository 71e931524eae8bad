package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

const listenLostLog = "berth/postgres: LISTEN connection lost; polling until it is back"

// waitLogs waits up to timeout for n records whose message is msg.
func waitLogs(t *testing.T, logs *logRecorder, msg string, n int, timeout time.Duration) []slog.Record {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		recs, added := logs.matching(msg)
		if len(recs) >= n {
			return recs
		}
		select {
		case <-added:
		case <-deadline.C:
			t.Fatalf("%d logs %q within %s, want %d", len(recs), msg, timeout, n)
		}
	}
}

// TestListenFlappingBacksOff: a server that accepts the LISTEN and drops
// the connection at once gets reconnects at growing delays (50 ms, 100 ms,
// 200 ms, ...), not one every 50 ms for ever; a connection that delivered
// a notification before it was lost counts as healthy, and the next
// reconnect is quick again. Before the fix every successful LISTEN reset
// the delay, so the flapping server saw a reconnect every ~50 ms.
func TestListenFlappingBacksOff(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	q := "flap_" + suffix()
	cutter := startPGProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), q)
	cutter.cutListens.Store(true)
	host, port, _ := net.SplitHostPort(cutter.ln.Addr().String())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := newLogRecorder()
	b := newBroker(t, pool, postgres.Options{Logger: slog.New(logs)})
	rctx, rc := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := b.Receive(rctx, q, 1); !errors.Is(err, context.DeadlineExceeded) { // starts the listener
		t.Fatalf("Receive on an empty queue: %v", err)
	}
	rc()

	const flaps = 6
	recs := waitLogs(t, logs, listenLostLog, flaps, 30*time.Second)[:flaps]
	if cuts := cutter.cuts.Load(); cuts < flaps {
		t.Fatalf("%d LISTENs cut, want at least %d (one per reconnect logged)", cuts, flaps)
	}
	var delays []time.Duration
	for _, rec := range recs {
		delays = append(delays, attr(rec, "retry_in").Duration())
	}
	for i := 1; i < len(delays); i++ {
		if delays[i] <= delays[i-1] {
			t.Fatalf("reconnect delays after LISTENs dropped at once: %v; want each longer than the one before", delays)
		}
	}

	// A connection that delivers a notification is healthy: its loss is
	// followed by a quick reconnect.
	cutter.cutListens.Store(false)
	for notified := false; !notified; {
		if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil { // NOTIFY q
			t.Fatal(err)
		}
		select {
		case <-cutter.marked:
			notified = true
		case <-time.After(100 * time.Millisecond): // the listener not back yet
		case <-ctx.Done():
			t.Fatal("no notification reached the listener")
		}
	}
	before := len(waitLogs(t, logs, listenLostLog, flaps, time.Second))
	cutter.reset(false)
	after := waitLogs(t, logs, listenLostLog, before+1, 30*time.Second)[before]
	if d := attr(after, "retry_in").Duration(); d != delays[0] {
		t.Errorf("reconnect delay after a connection that delivered a notification: %v, want the first one, %v", d, delays[0])
	}
}
