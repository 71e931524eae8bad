package pause_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// TestSyncReadThatHangsIsBounded: a read of the pause table that never
// answers (the database's host frozen, its connection black-holed after a
// failover) is a failed read once it outlasts the interval, and the next
// read, on a new connection, applies the pause. Before, Sync waited on the
// hung read with no deadline: a pause recorded meanwhile was never applied
// (for as long as the TCP connection stayed up — here, forever).
func TestSyncReadThatHangsIsBounded(t *testing.T) {
	s, _, schema := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	px := integration.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(px.Addr())
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.MaxConns = 2
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	defer px.Close() // first: the frozen connections end at once
	viaProxy, err := pause.NewPG(proxied, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}

	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("q"); err != nil { // held until Sync's first read
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- pause.Sync(sctx, w, viaProxy, pause.SyncOptions{Interval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, 10*time.Second, func() bool { return !w.Paused("q") }, "the first read to resume q")

	px.FreezeOpen()                              // the open connections hang; a new one goes through
	if _, err := s.Pause(ctx, "q"); err != nil { // through a connection of its own
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 15*time.Second, func() bool { return w.Paused("q") }, "the pause to reach the Worker past a hung read")
	t.Logf("applied after %s", time.Since(start))
}

func waitFor(t *testing.T, d time.Duration, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
