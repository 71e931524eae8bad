package pgstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestLostClaimReplyFreesKey: a lease-mode claim that the server stored and
// whose reply is lost with its connection (reset while the reply was on the
// wire) must not hold the key for the whole claim lease. The guard chose the
// claim's owner token before sending it, so it releases the claim by that
// token; the redelivery then runs the operation at once, once. Before, the
// key stayed in progress, owned by nobody, until the claim expired (ten
// minutes here): every redelivery was told ErrInProgress.
func TestLostClaimReplyFreesKey(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proxied, proxy := proxiedPool(t, e)
	store, err := pgstore.New(proxied, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease,
		ClaimLease: 10 * time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var effects atomic.Int32
	effect := func(context.Context) error { effects.Add(1); return nil }
	// Prepare the claim statement on the pool's connection, so the claim
	// below is one round trip whose reply the proxy holds.
	if _, err := g.Do(ctx, idempotency.Operation{Key: "warm-" + randSuffix(), JobType: "t", Fingerprint: "fp"}, effect); err != nil {
		t.Fatal(err)
	}
	effects.Store(0)

	op := idempotency.Operation{Key: "lost-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	proxy.FreezeReplies()
	first := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, op, effect)
		first <- err
	}()
	// The claim is stored once the server shows it; its reply is held.
	for {
		rec, err := e.store.Get(ctx, op.Key)
		if err == nil {
			if rec.Status != idempotency.StatusInProgress {
				proxy.Thaw()
				t.Fatalf("the claim stored %q, want in_progress", rec.Status)
			}
			break
		}
		if !errors.Is(err, idempotency.ErrNotFound) {
			proxy.Thaw()
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			proxy.Thaw()
			t.Fatal("the claim never reached the server")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.Reset() // the reply is lost with the connection
	proxy.Thaw()  // new connections get their replies
	if err := <-first; err == nil {
		t.Fatal("Do whose claim's reply was lost returned nil")
	}
	if n := effects.Load(); n != 0 {
		t.Fatalf("the operation ran %d times without a claim the guard saw", n)
	}

	// The redelivery (another worker, straight to the server) runs the
	// operation now, not after the ten-minute claim.
	g2, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease,
		ClaimLease: 10 * time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ran, err := g2.Do(ctx, op, effect)
	if err != nil {
		t.Fatalf("redelivery after the lost claim: %v, want the operation run", err)
	}
	if !ran || effects.Load() != 1 {
		t.Fatalf("redelivery: ran=%v, effects=%d; want true, 1", ran, effects.Load())
	}
	if ran, err := g2.Do(ctx, op, effect); err != nil || ran {
		t.Fatalf("a later duplicate: ran=%v err=%v, want false, nil", ran, err)
	}
	if n := effects.Load(); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// TestLostCompleteReplyIsSuccess: a lease-mode completion that the server
// stored and whose reply is lost with its connection is retried by the
// guard; the retry must see its own completion and report success. Before,
// the retry found the claim no longer in progress and reported ErrClaimLost:
// the job was retried for nothing and a claim_lost event (the page-worthy
// BerthIdempotencyClaimLost alert: "the effect may have run twice") was
// counted although the effect ran once and was recorded.
func TestLostCompleteReplyIsSuccess(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proxied, proxy := proxiedPool(t, e)
	store, err := pgstore.New(proxied, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease,
		ClaimLease: 10 * time.Minute, Stats: &stats, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// Prepare the claim and completion statements on the pool's connection,
	// so the completion below is one round trip whose reply the proxy holds.
	if _, err := g.Do(ctx, idempotency.Operation{Key: "warm-" + randSuffix(), JobType: "t", Fingerprint: "fp"},
		func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "lost-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	var effects atomic.Int32
	first := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, op, func(context.Context) error {
			effects.Add(1)
			proxy.FreezeReplies() // the completion that follows loses its reply
			return nil
		})
		first <- err
	}()
	// The completion is stored once the server shows it; its reply is held.
	for {
		rec, err := e.store.Get(ctx, op.Key)
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
			proxy.Thaw()
			t.Fatal(err)
		}
		if err == nil && rec.Status == idempotency.StatusCompleted {
			break
		}
		select {
		case <-ctx.Done():
			proxy.Thaw()
			t.Fatal("the completion never reached the server")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.Reset() // the reply is lost with the connection
	proxy.Thaw()  // the guard's retry gets its reply
	if err := <-first; err != nil {
		t.Errorf("Do whose completion's reply was lost: %v, want nil (the effect ran once and is recorded)", err)
	}
	if n := stats.Snapshot().ClaimsLost; n != 0 {
		t.Errorf("%d claim_lost events counted for a completion that only lost its reply", n)
	}
	if ran, err := g.Do(ctx, op, func(context.Context) error { effects.Add(1); return nil }); err != nil || ran {
		t.Fatalf("the redelivery: ran=%v err=%v, want false, nil", ran, err)
	}
	if n := effects.Load(); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// proxiedPool returns a one-connection pool to e's database through a fault
// proxy, and the proxy.
func proxiedPool(t *testing.T, e *env) (*pgxpool.Pool, *integration.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := integration.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 1 // the warm-up prepares the statements on the connection that loses its reply
	// No liveness ping on acquire: it would wait for a held reply.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}
