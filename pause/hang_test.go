package pause_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// freezer is a TCP proxy to PostgreSQL whose freeze stops every connection
// open at that moment without closing it (the primary paused, a path
// black-holed: no reply, no reset), while new connections go through.
type freezer struct {
	ln     net.Listener
	target string
	gen    atomic.Int64 // connections of a generation below it are frozen
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
	once   sync.Once
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *freezer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			_, _ = c.Close(), up.Close()
			return
		}
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		gen := f.gen.Load()
		f.wg.Add(2)
		go f.pipe(c, up, gen)
		go f.pipe(up, c, gen)
	}
}

// pipe copies src to dst until either closes; once frozen it forwards
// nothing more and keeps both open.
func (f *freezer) pipe(dst, src net.Conn, gen int64) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if f.gen.Load() > gen {
			continue // frozen: swallow, never answer, never close
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}

func (f *freezer) freeze() { f.gen.Add(1) }

func (f *freezer) close() {
	f.once.Do(func() {
		_ = f.ln.Close()
		f.mu.Lock()
		f.closed = true
		for _, c := range f.conns {
			_ = c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
}

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
	f := newFreezer(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(f.ln.Addr().String())
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
	defer f.close() // first: the frozen connections end at once
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

	f.freeze()
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
