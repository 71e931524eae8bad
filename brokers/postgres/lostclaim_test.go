package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// logRecorder is a slog.Handler that keeps every record's message and
// attributes, for tests that look at what the broker logged.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	added   chan struct{} // closed and replaced at each record
}

func newLogRecorder() *logRecorder { return &logRecorder{added: make(chan struct{})} }

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	close(r.added)
	r.added = make(chan struct{})
	return nil
}

// matching returns the records whose message is msg, and a channel closed
// at the next record.
func (r *logRecorder) matching(msg string) ([]slog.Record, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.records {
		if rec.Message == msg {
			out = append(out, rec)
		}
	}
	return out, r.added
}

// attr returns rec's attribute key.
func attr(rec slog.Record, key string) slog.Value {
	var v slog.Value
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// waitLog waits up to timeout for a record whose message is msg, and
// returns the first.
func waitLog(t *testing.T, logs *logRecorder, msg string, timeout time.Duration) slog.Record {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		recs, added := logs.matching(msg)
		if len(recs) > 0 {
			return recs[0]
		}
		select {
		case <-added:
		case <-deadline.C:
			t.Fatalf("no log %q within %s", msg, timeout)
		}
	}
}

// handedBackLog is the broker's log of a lost claim's rows handed back.
const handedBackLog = "berth/postgres: a claim's reply was lost; the jobs it took are handed back (no attempt counted)"

// proxiedConfig returns a pool configuration for the test database through
// a fault proxy, and the proxy.
func proxiedConfig(t *testing.T) (*pgxpool.Config, *integration.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
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
	return cfg, proxy
}

// pgProxiedConfig is a pool config whose connections go through a pgProxy
// (returned) that drops cancel requests, as a network that lost them would.
func pgProxiedConfig(t *testing.T) (*pgxpool.Config, *pgProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := startPGProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), "")
	proxy.dropCancels.Store(true)
	host, port, _ := net.SplitHostPort(proxy.ln.Addr().String())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	return cfg, proxy
}

// slowClaims makes every claim on schema's jobs table (rows becoming
// 'processing') sleep secs seconds before it commits; a hand-back (rows
// leaving 'processing') does not.
func slowClaims(ctx context.Context, t *testing.T, admin *pgxpool.Pool, schema string, secs int) {
	t.Helper()
	if _, err := admin.Exec(ctx, `CREATE FUNCTION `+schema+`.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'processing') THEN PERFORM pg_sleep(`+strconv.Itoa(secs)+`); END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER slow_claim AFTER UPDATE ON `+schema+`.jobs REFERENCING NEW TABLE AS new_rows
			FOR EACH STATEMENT EXECUTE FUNCTION `+schema+`.slow_claim()`); err != nil {
		t.Fatal(err)
	}
}

// requireAllBack fails t unless queue q of schema holds its n jobs, none
// leased ('processing') and none with an attempt counted: what a hand-back
// leaves. after names the moment, for the message.
func requireAllBack(ctx context.Context, t *testing.T, admin *pgxpool.Pool, schema, q string, n int, after string) {
	t.Helper()
	var leased, counted, total int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processing'),
		count(*) FILTER (WHERE attempt_count > 0), count(*)
		FROM `+schema+`.jobs WHERE queue = $1`, q).Scan(&leased, &counted, &total); err != nil {
		t.Fatal(err)
	}
	if leased != 0 || counted != 0 || total != n {
		t.Fatalf("after %s: %d jobs, %d leased to nobody, %d with an attempt counted; want %d, 0, 0", after, total, leased, counted, n)
	}
}

// receiveEachOnce receives the jobs ids of q from b and acks them, failing t
// unless each comes exactly once, at its first attempt.
func receiveEachOnce(ctx context.Context, t *testing.T, b *postgres.Broker, q string, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, d := range receiveN(t, b, q, len(ids)) {
		if seen[d.Message().ID] || d.Attempt() != 1 {
			t.Errorf("job %s: seen before %v, Attempt() = %d; want once, at 1", d.Message().ID, seen[d.Message().ID], d.Attempt())
		}
		seen[d.Message().ID] = true
		if err := d.Ack(context.WithoutCancel(ctx)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("job %s lost", id)
		}
	}
}

// TestLostClaimReplyHandsBack: a claim the server committed and whose reply
// is lost with its connection (reset by the network while the reply was on
// the wire) does not strand its jobs for a lease with an attempt spent:
// Receive reports the database unavailable, and the broker hands the rows
// back on another connection, found by the claim's lease token, which the
// broker chose before sending the claim. The jobs are claimable again at
// once (the lease is ten minutes), attempt_count 0, and the next Receive
// gets every job once at Attempt() 1. Before the fix they stayed
// 'processing' with attempt_count 1 until the lease ran out.
func TestLostClaimReplyHandsBack(t *testing.T) {
	cfg, proxy := proxiedConfig(t)
	// No liveness ping on acquire: it would wait for a held reply.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-lost-claim-admin-"+suffix(), 2) // straight to the server
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(logs)})
	q := "lost_" + suffix()
	// Prepare the claim statement on the pool's connection, so the claim is
	// one round trip whose reply the proxy holds.
	wctx, wc := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := b.Receive(wctx, q+"_warm", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("warm-up Receive on an empty queue: %v", err)
	}
	wc()
	const n = 5
	ids := publishN(t, b, q, n)

	proxy.FreezeReplies()
	done := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, n)
		if len(ds) > 0 {
			err = errors.New("got deliveries")
		}
		done <- err
	}()
	// The claim has committed on the server once the admin pool sees its
	// rows leased; its reply is held by the proxy.
	counts := func() (leased, counted, total int) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processing'),
			count(*) FILTER (WHERE attempt_count > 0), count(*)
			FROM `+b.Schema()+`.jobs WHERE queue = $1`, q).Scan(&leased, &counted, &total); err != nil {
			t.Fatal(err)
		}
		return
	}
	for {
		if leased, _, _ := counts(); leased == n {
			break
		}
		select {
		case <-ctx.Done():
			proxy.Thaw()
			t.Fatal("the claim never ran")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.Reset() // the reply is lost with the connection
	proxy.Thaw()  // new connections get their replies
	if err := <-done; !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose claim's reply was lost: %v, want ErrUnavailable", err)
	}

	// Back well before the ten-minute lease.
	back := time.NewTimer(20 * time.Second)
	defer back.Stop()
	for {
		leased, counted, total := counts()
		if leased == 0 {
			if counted != 0 || total != n {
				t.Fatalf("after the hand-back: %d jobs, %d with an attempt counted; want %d, 0", total, counted, n)
			}
			break
		}
		select {
		case <-back.C:
			t.Fatalf("the lost claim's %d jobs are still leased to nobody (%d with an attempt counted)", leased, counted)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if rec := waitLog(t, logs, handedBackLog, 20*time.Second); attr(rec, "jobs").Int64() != n {
		t.Errorf("hand-back log: %v, want jobs=%d", rec, n)
	}
	seen := map[string]bool{}
	for _, d := range receiveN(t, b, q, n) {
		if seen[d.Message().ID] {
			t.Errorf("job %s delivered twice", d.Message().ID)
		}
		seen[d.Message().ID] = true
		if d.Attempt() != 1 {
			t.Errorf("job %s: Attempt() = %d after the lost claim, want 1", d.Message().ID, d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("job %s lost", id)
		}
	}
}

// TestLostClaimWhileItRuns: the connection of a claim is lost while the
// server still runs the claim (here a trigger makes it sleep before its
// commit), and so is the cancel request pgx sends then; the claim commits,
// unseen by the broker. The hand-back must wait for the claim's server
// process to finish rather than stop at a first look that finds none of
// its rows: the jobs come back at once, no attempt counted, none lost.
func TestLostClaimWhileItRuns(t *testing.T) {
	cfg, proxy := pgProxiedConfig(t)
	app := "berth-lost-running-" + suffix()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-lost-running-admin-"+suffix(), 2)
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(logs)})
	q := "lostrun_" + suffix()
	const n = 3
	ids := publishN(t, b, q, n)
	// A claim (rows becoming 'processing') sleeps before it commits; the
	// hand-back (rows leaving it) does not.
	slowClaims(ctx, t, admin, b.Schema(), 2)
	done := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, n)
		if len(ds) > 0 {
			err = errors.New("got deliveries")
		}
		done <- err
	}()
	for { // the claim sleeps in its trigger, uncommitted
		var sleeping bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event = 'PgSleep')`, app).Scan(&sleeping); err != nil {
			t.Fatal(err)
		}
		if sleeping {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never ran")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.reset(true)
	if err := <-done; !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose claim's connection was lost: %v, want ErrUnavailable", err)
	}
	// Until the claim has committed, its rows look untouched: wait for
	// the hand-back, then look.
	if rec := waitLog(t, logs, handedBackLog, 20*time.Second); attr(rec, "jobs").Int64() != n {
		t.Errorf("hand-back log: %v, want jobs=%d", rec, n)
	}
	requireAllBack(ctx, t, admin, b.Schema(), q, n, "the hand-back")
	if _, err := admin.Exec(ctx, `DROP TRIGGER slow_claim ON `+b.Schema()+`.jobs`); err != nil {
		t.Fatal(err)
	}
	receiveEachOnce(ctx, t, b, q, ids)
}
