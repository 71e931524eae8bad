package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
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

// neverCalled is the publisher of a relay whose database never gives it a
// row.
type neverCalled struct{ t *testing.T }

func (p neverCalled) Publish(context.Context, string, ...*sdk.Message) error {
	p.t.Error("Publish called, with no database to read rows from")
	return errors.New("unexpected publish")
}

const relayStoppedLog = "outbox: relay stopped: the pool is closed"

// startRelay runs box's relay to pub on a goroutine and returns its result
// channel and the cancel of its context, which the test's cleanup calls and
// waits for.
func startRelay(t *testing.T, box *outbox.Outbox, pub sdk.Publisher, logs *records) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		done <- box.Relay(ctx, pub, outbox.RelayOptions{
			PollInterval:  time.Millisecond,
			OutageBackoff: sdk.Backoff{Max: 20 * time.Millisecond},
			Logger:        slog.New(logs),
		})
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return done, cancel
}

// waitRelayClosed waits for Relay to return after its pool was closed, and
// checks that it said so: an error wrapping sdk.ErrClosed, logged once.
func waitRelayClosed(t *testing.T, done <-chan error, logs *records) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, sdk.ErrClosed) {
			t.Fatalf("Relay with its pool closed returned %v; want an error wrapping sdk.ErrClosed", err)
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatalf("Relay still running %s after its pool was closed; logs: %d outage warnings",
			berthtest.WaitTimeout, len(logs.at(slog.LevelWarn, "cannot read the outbox table")))
	}
	if n := len(logs.at(slog.LevelWarn, relayStoppedLog)); n != 1 {
		t.Errorf("%d logs %q, want 1", n, relayStoppedLog)
	}
	if n := len(logs.at(slog.LevelWarn, "cannot read the outbox table")); n != 0 {
		t.Errorf("%d outage warnings for a closed pool, want 0", n)
	}
}

// TestRelayStopsWhenPoolClosed: when the application closes the pool the
// outbox was given while Relay runs, Relay returns an error wrapping
// sdk.ErrClosed and logs it once, whether the pool was idle or a connect
// was under way (which the pool's Close cuts with a cancel). Before, it
// polled the closed pool for ever, logging "cannot read the outbox table"
// once a minute.
func TestRelayStopsWhenPoolClosed(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		ctx := context.Background()
		_, _, b, schema := setupSchema(t, outbox.Options{})
		relayPool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(relayPool.Close)
		box, err := outbox.New(relayPool, outbox.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		add(t, relayPool, box, "q", &sdk.Message{Type: "t"})
		logs := &records{}
		done, _ := startRelay(t, box, b, logs)
		drain(t, b, "q", 1) // the relay runs
		relayPool.Close()
		waitRelayClosed(t, done, logs)
	})
	t.Run("connect under way", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig("postgres://postgres@" + integration.SilentServer(t) + "/test?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.ConnectTimeout = time.Minute // the connect waits for the silent server
		dialed := make(chan struct{})
		var once sync.Once
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				once.Do(func() { close(dialed) })
			}
			return c, err
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		box, err := outbox.New(pool, outbox.Options{})
		if err != nil {
			t.Fatal(err)
		}
		logs := &records{}
		done, _ := startRelay(t, box, neverCalled{t}, logs)
		select {
		case <-dialed: // the relay's connect waits for the startup reply
		case <-time.After(berthtest.WaitTimeout):
			t.Fatal("the relay did not connect")
		}
		pool.Close() // cuts the connect with a cancel
		waitRelayClosed(t, done, logs)
	})
	// The application's connect hooks get the connect's context, which the
	// pool's Close cancels too: a BeforeConnect fetching a password (an IAM
	// token, say) or an AfterConnect loading types is cut with an error of
	// its own wrapping context.Canceled, not a *pgconn.ConnectError. Before,
	// only the latter was probed, so the relay took the cut hook for an
	// outage (a warning, a backoff) before the next pass found the pool
	// closed.
	hooks := map[string]func(cfg *pgxpool.Config, started func()){
		"BeforeConnect under way": func(cfg *pgxpool.Config, started func()) {
			cfg.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
				started()
				<-ctx.Done()
				return fmt.Errorf("fetch the password: %w", ctx.Err())
			}
		},
		"AfterConnect under way": func(cfg *pgxpool.Config, started func()) {
			cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				started()
				_, err := conn.Exec(ctx, "SELECT pg_sleep(60)")
				return err
			}
		},
	}
	for name, hook := range hooks {
		t.Run(name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			started := make(chan struct{})
			var once sync.Once
			hook(cfg, func() { once.Do(func() { close(started) }) })
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			box, err := outbox.New(pool, outbox.Options{})
			if err != nil {
				t.Fatal(err)
			}
			logs := &records{}
			done, _ := startRelay(t, box, neverCalled{t}, logs)
			select {
			case <-started: // the relay's connect runs the hook
			case <-time.After(berthtest.WaitTimeout):
				t.Fatal("the relay did not connect")
			}
			pool.Close() // cuts the hook with a cancel
			waitRelayClosed(t, done, logs)
		})
	}
}

// TestRelayOutageIsNotClosedPool: a database that refuses connections or
// never answers (connect timeout) is down, not closed: the relay keeps
// polling it and returns nil when its context ends.
func TestRelayOutageIsNotClosedPool(t *testing.T) {
	refused := func(t testing.TB) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		return addr
	}
	for name, addr := range map[string]func(testing.TB) string{"refused": refused, "silent": integration.SilentServer} {
		t.Run(name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr(t) + "/test?sslmode=disable")
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.ConnectTimeout = 50 * time.Millisecond
			var dials atomic.Int64
			cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			box, err := outbox.New(pool, outbox.Options{})
			if err != nil {
				t.Fatal(err)
			}
			logs := &records{}
			done, cancel := startRelay(t, box, neverCalled{t}, logs)
			deadline := time.After(berthtest.WaitTimeout)
			for dials.Load() < 5 {
				select {
				case err := <-done:
					t.Fatalf("Relay returned %v while the database was only down", err)
				case <-deadline:
					t.Fatalf("%d connects within %s, want 5", dials.Load(), berthtest.WaitTimeout)
				case <-time.After(5 * time.Millisecond):
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Relay after its context ended, the database down: %v; want nil", err)
			}
			if n := len(logs.at(slog.LevelWarn, relayStoppedLog)); n != 0 {
				t.Errorf("%d logs %q for a database that is down, want 0", n, relayStoppedLog)
			}
			if n := len(logs.at(slog.LevelWarn, "cannot read the outbox table")); n != 1 {
				t.Errorf("%d outage warnings, want 1", n)
			}
		})
	}
}
