package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// slowCounting publishes to its Publisher after a delay (cut short by ctx)
// and counts the publishes of each message ID.
type slowCounting struct {
	sdk.Publisher
	delay time.Duration
	mu    sync.Mutex
	sent  map[string]int
}

func (s *slowCounting) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := s.Publisher.Publish(ctx, q, msgs...); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.sent[m.ID]++
	}
	return nil
}

func (s *slowCounting) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[id]
}

// poolWith opens a pool whose sessions start with the given server settings
// (as `options=-c name=value` in the DSN would), closed at cleanup.
func poolWith(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A server-side idle_in_transaction_session_timeout shorter than a publish
// must not end the relay's transaction while the broker works: before, the
// server terminated the session mid-batch, the commit failed, the rows stayed
// and every pass published them again (same IDs), for ever.
func TestShortIdleInTransactionTimeoutDoesNotRepublish(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	short := poolWith(t, map[string]string{"idle_in_transaction_session_timeout": "200ms"})
	box, err := outbox.New(short, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"m1", "m2", "m3"}
	for _, id := range ids {
		add(t, pool, box, "q", &sdk.Message{ID: id})
	}
	pub := &slowCounting{Publisher: b, delay: 600 * time.Millisecond, sent: map[string]int{}}
	for pass := 0; pass < 3; pass++ {
		n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{})
		if err != nil {
			t.Errorf("pass %d: RelayOnce = %d, %v", pass, n, err)
		}
		if pending, err := box.Pending(ctx); err != nil {
			t.Fatal(err)
		} else if pending == 0 {
			break
		}
	}
	for _, id := range ids {
		if n := pub.count(id); n != 1 {
			t.Errorf("message %s published %d times, want once", id, n)
		}
	}
	if pending, err := box.Pending(ctx); err != nil || pending != 0 {
		t.Errorf("Pending = %d, %v; want 0: the published rows were never deleted", pending, err)
	}
	drain(t, b, "q", len(ids))
}

// terminating terminates the relay's session (found by its application
// name) from inside each of its first kills publishes, then publishes.
type terminating struct {
	sdk.Publisher
	pool  *pgxpool.Pool // another session's
	app   string
	mu    sync.Mutex
	kills int
	sent  map[string]int
}

func (p *terminating) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kills > 0 {
		p.kills--
		var n int
		if err := p.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'idle in transaction'`, p.app).Scan(&n); err != nil || n != 1 {
			return fmt.Errorf("terminating the relay's session: %d sessions, %v", n, err)
		}
	}
	if err := p.Publisher.Publish(ctx, q, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		p.sent[m.ID]++
	}
	return nil
}

// A session the server ends during the publish is reported as such: the
// error wraps ErrPublishNotRecorded and names the cause, Relay logs it as an
// error, and the row is published again with the same ID, then deleted.
func TestTerminatedSessionIsReported(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	app := "berth_outbox_test_" + schema
	box, err := outbox.New(poolWith(t, map[string]string{"application_name": app}), outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	pub := &terminating{Publisher: b, pool: pool, app: app, kills: 2, sent: map[string]int{}}

	n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{})
	if !errors.Is(err, outbox.ErrPublishNotRecorded) || n != 0 {
		t.Fatalf("RelayOnce = %d, %v; want 0 and ErrPublishNotRecorded", n, err)
	}
	if !strings.Contains(err.Error(), "pg_terminate_backend") || !strings.Contains(err.Error(), "57P01") {
		t.Errorf("the error does not say why: %v", err)
	}

	var logs syncbuf.Buffer
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- box.Relay(rctx, pub, outbox.RelayOptions{PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	}()
	deadline := time.Now().Add(berthtest.WaitTimeout)
	for {
		if pending, err := box.Pending(ctx); err == nil && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the row was never deleted; log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	log := logs.String()
	if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "ended the relay's transaction") || !strings.Contains(log, "published again") {
		t.Errorf("Relay did not log the lost transaction as an error:\n%s", log)
	}
	pub.mu.Lock()
	sent := pub.sent["m1"]
	pub.mu.Unlock()
	if sent != 3 {
		t.Errorf("m1 published %d times, want 3 (twice lost, then recorded)", sent)
	}
	t.Logf("RelayOnce: %v\nRelay log:\n%s", err, log)
}

// blocking publishes nothing until its context ends.
type blocking struct{ sdk.Publisher }

func (blocking) Publish(ctx context.Context, _ string, _ ...*sdk.Message) error {
	<-ctx.Done()
	return ctx.Err()
}

// RelayOptions.PublishTimeout bounds a publish: the row is postponed, not
// parked, its last error names the limit, and the relay's transaction
// outlives a shorter server idle_in_transaction_session_timeout.
func TestPublishTimeoutPostponesTheRow(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	box, err := outbox.New(poolWith(t, map[string]string{"idle_in_transaction_session_timeout": "200ms"}), outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	opts := outbox.RelayOptions{PublishTimeout: 500 * time.Millisecond, MaxAttempts: 1, Backoff: fast}
	n, err := box.RelayOnce(ctx, blocking{b}, opts)
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, outbox.ErrPublishNotRecorded) {
		t.Fatalf("RelayOnce = %d, %v; want the publish timeout, recorded", n, err)
	}
	if p, err := box.Parked(ctx, 0); err != nil || len(p) != 0 {
		t.Fatalf("Parked = %v, %v: a timeout parked the row", p, err)
	}
	attempts, lastErr := attemptsOf(t, pool, schema, "m1")
	if attempts != 1 || !strings.Contains(lastErr, "PublishTimeout") {
		t.Errorf("row: attempts %d, last error %q; want 1 and the timeout", attempts, lastErr)
	}
	relayUntil(t, box, b, opts, "published", func() bool { n, _ := box.Pending(ctx); return n == 0 })
	drain(t, b, "q", 1)
}

// terminatingDown terminates the relay's session during the publish, then
// fails it as a broker that is down: nothing is published.
type terminatingDown struct{ terminating }

func (p *terminatingDown) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	var n int
	if err := p.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'idle in transaction'`, p.app).Scan(&n); err != nil || n != 1 {
		return fmt.Errorf("terminating the relay's session: %d sessions, %v", n, err)
	}
	return fmt.Errorf("%w: broker down", sdk.ErrUnavailable)
}

// ErrPublishNotRecorded says rows were published but not recorded: a pass
// that published nothing (the broker was down) and then lost its
// transaction must not return it, nor have Relay log at ERROR that
// published rows will be published again.
func TestNotRecordedOnlyWhenPublished(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	app := "berth_outbox_down_" + schema
	box, err := outbox.New(poolWith(t, map[string]string{"application_name": app}), outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	pub := &terminatingDown{terminating{Publisher: b, pool: pool, app: app}}
	n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{})
	if n != 0 || err == nil {
		t.Fatalf("RelayOnce = %d, %v", n, err)
	}
	if errors.Is(err, outbox.ErrPublishNotRecorded) {
		t.Errorf("nothing was published, yet RelayOnce says %v", err)
	}
	if !strings.Contains(err.Error(), "57P01") {
		t.Errorf("the error does not say why the failures were not recorded: %v", err)
	}
}

// deadlineSeen is a slowCounting that records whether any Publish ran
// under a context with a deadline.
type deadlineSeen struct {
	slowCounting
	bounded bool
}

func (p *deadlineSeen) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	if _, ok := ctx.Deadline(); ok {
		p.mu.Lock()
		p.bounded = true
		p.mu.Unlock()
	}
	return p.slowCounting.Publish(ctx, q, msgs...)
}

// A negative RelayOptions.PublishTimeout means no bound: the publish runs
// under the relay's own context (here without a deadline), and the relay
// turns a server idle_in_transaction_session_timeout shorter than the
// publish off for its transaction, so that the slow publish is recorded
// once. Before, any PublishTimeout <= 0 meant the 30 s default: a user with
// publishes slower than that could not turn it off.
func TestNegativePublishTimeoutIsUnbounded(t *testing.T) {
	ctx := context.Background()
	pool, _, b, schema := setupSchema(t, outbox.Options{})
	box, err := outbox.New(poolWith(t, map[string]string{"idle_in_transaction_session_timeout": "200ms"}), outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	pub := &deadlineSeen{slowCounting: slowCounting{Publisher: b, delay: 600 * time.Millisecond, sent: map[string]int{}}}
	n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{PublishTimeout: -1})
	if n != 1 || err != nil {
		t.Fatalf("RelayOnce with PublishTimeout -1 and a publish slower than the server's idle timeout = %d, %v; want 1, nil", n, err)
	}
	pub.mu.Lock()
	bounded := pub.bounded
	pub.mu.Unlock()
	if bounded {
		t.Errorf("the publish ran under a deadline with PublishTimeout -1 (no bound)")
	}
	if c := pub.count("m1"); c != 1 {
		t.Errorf("m1 published %d times, want once", c)
	}
	if pending, err := box.Pending(ctx); err != nil || pending != 0 {
		t.Errorf("Pending = %d, %v; want 0", pending, err)
	}
	drain(t, b, "q", 1)
}
