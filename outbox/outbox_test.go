package outbox_test

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines, except pgx's own background close
// of a connection whose query a cancelled context interrupted (the relay
// tests cancel relays mid-query): pgconn sends Terminate and drains the
// socket in a goroutine bounded by its own 15 s deadline, which a loaded
// machine can still be running when the tests end (a fresh-clone CI run
// failed the package on it, every test passing).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn.(*PgConn).asyncClose.func1"))
}

// setup returns a pool, an outbox in a fresh schema, and a memory broker.
func setup(t *testing.T) (*pgxpool.Pool, *outbox.Outbox, *memory.Broker) {
	return setupWith(t, outbox.Options{})
}

func setupWith(t *testing.T, opts outbox.Options) (*pgxpool.Pool, *outbox.Outbox, *memory.Broker) {
	t.Helper()
	pool, box, b, _ := setupSchema(t, opts)
	return pool, box, b
}

// setupSchema is setupWith that also returns the outbox's schema.
func setupSchema(t *testing.T, opts outbox.Options) (*pgxpool.Pool, *outbox.Outbox, *memory.Broker, string) {
	t.Helper()
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
	opts.Schema = schema
	box, err := outbox.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatalf("Migrate is not idempotent: %v", err)
	}
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return pool, box, b, schema
}

func drain(t *testing.T, b *memory.Broker, queue string, want int) map[string]*sdk.Message {
	t.Helper()
	got := map[string]*sdk.Message{}
	ctx, cancel := context.WithTimeout(context.Background(), berthtest.WaitTimeout)
	defer cancel()
	for len(got) < want {
		ds, err := b.Receive(ctx, queue, 100)
		if err != nil {
			t.Fatalf("received %d of %d: %v", len(got), want, err)
		}
		for _, d := range ds {
			if _, dup := got[d.Message().ID]; dup {
				t.Errorf("message %s delivered twice", d.Message().ID)
			}
			got[d.Message().ID] = d.Message()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

func TestOnlyCommittedMessagesArePublished(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)

	rolledBack := &sdk.Message{Type: "email", Body: []byte("never")}
	tx, _ := pool.Begin(ctx)
	if err := box.Add(ctx, tx, "emails", rolledBack); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)

	committed := &sdk.Message{Type: "email", IdempotencyKey: "receipt:o1", Key: "o1",
		Headers: map[string]string{"lang": "ünïcode"}, Body: []byte{0, 1, 0xff}, CorrelationID: "flow-9"}
	tx, _ = pool.Begin(ctx)
	if err := box.Add(ctx, tx, "emails", committed); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	n, err := box.RelayOnce(ctx, b, outbox.RelayOptions{})
	if err != nil || n != 1 {
		t.Fatalf("RelayOnce = %d, %v; want 1 committed message", n, err)
	}
	got := drain(t, b, "emails", 1)
	m := got[committed.ID]
	if m == nil {
		t.Fatalf("published %v, want the committed message %s (ID chosen at Add)", got, committed.ID)
	}
	if m.IdempotencyKey != "receipt:o1" || m.Key != "o1" || m.CorrelationID != "flow-9" ||
		m.Header("lang") != "ünïcode" || string(m.Body) != string([]byte{0, 1, 0xff}) || m.Type != "email" {
		t.Errorf("fields changed on the way: %+v", m)
	}
	if p, _ := box.Pending(ctx); p != 0 {
		t.Errorf("%d rows left after a successful relay", p)
	}
	if n, _ := box.RelayOnce(ctx, b, outbox.RelayOptions{}); n != 0 {
		t.Errorf("second relay published %d: rows must be published once", n)
	}
}

// failing publishes nothing for the first n calls.
type failing struct {
	sdk.Publisher
	mu   sync.Mutex
	left int
}

var errDown = errors.New("broker down")

func (f *failing) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left > 0 {
		f.left--
		return fmt.Errorf("%w: %w", sdk.ErrUnavailable, errDown)
	}
	return f.Publisher.Publish(ctx, q, msgs...)
}

func TestFailedPublishKeepsRowsForRetry(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	tx, _ := pool.Begin(ctx)
	m := &sdk.Message{Type: "x"}
	if err := box.Add(ctx, tx, "q", m); err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(ctx)

	pub := &failing{Publisher: b, left: 1}
	opts := outbox.RelayOptions{Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond}}
	if n, err := box.RelayOnce(ctx, pub, opts); !errors.Is(err, errDown) || n != 0 {
		t.Fatalf("RelayOnce with the broker down = %d, %v", n, err)
	}
	if p, _ := box.Pending(ctx); p != 1 {
		t.Fatalf("pending %d after a failed publish, want 1: nothing may be lost", p)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- box.Relay(rctx, pub, outbox.RelayOptions{PollInterval: 5 * time.Millisecond, Backoff: opts.Backoff})
	}()
	got := drain(t, b, "q", 1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got[m.ID] == nil {
		t.Fatalf("the retried row was published under another ID: %v", got)
	}
}

func TestConcurrentRelaysPublishEachRowOnce(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	const total = 1000
	ids := map[string]bool{}
	for i := 0; i < total; i += 100 {
		tx, _ := pool.Begin(ctx)
		var msgs []*sdk.Message
		for j := 0; j < 100; j++ {
			msgs = append(msgs, &sdk.Message{Type: "x", Body: []byte(fmt.Sprint(i + j))})
		}
		if err := box.Add(ctx, tx, "q", msgs...); err != nil {
			t.Fatal(err)
		}
		_ = tx.Commit(ctx)
		for _, m := range msgs {
			ids[m.ID] = true
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = box.Relay(rctx, b, outbox.RelayOptions{BatchSize: 25, PollInterval: 5 * time.Millisecond})
		}()
	}
	got := drain(t, b, "q", total) // fails on any duplicate
	cancel()
	wg.Wait()
	for id := range ids {
		if got[id] == nil {
			t.Fatalf("message %s lost", id)
		}
	}
	st, err := b.Stats(ctx, "q")
	if err != nil || st.Ready != 0 {
		t.Fatalf("stats %+v %v: something was published twice", st, err)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)
	if err := box.Add(ctx, tx, "bad queue", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("invalid queue: %v", err)
	}
	if err := box.Add(ctx, tx, "q", &sdk.Message{Body: make([]byte, 300*1024)}); !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Errorf("oversized: %v", err)
	}
	if err := box.Add(ctx, tx, "q", &sdk.Message{Headers: map[string]string{"x": "a\x00b"}}); !errors.Is(err, sdk.ErrInvalidHeader) {
		t.Errorf("NUL in a header: %v, want ErrInvalidHeader", err)
	}
	if err := box.Add(ctx, tx, "q", &sdk.Message{Key: "a\x00b"}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("NUL in Key: %v, want ErrInvalidMessage", err)
	}
	if err := box.Add(ctx, tx, "q", &sdk.Message{Headers: map[string]string{"berth-dlq-queue": "x"}}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("reserved header: %v, want ErrInvalidMessage", err)
	}
	if _, err := outbox.New(pool, outbox.Options{Table: "x; DROP TABLE y"}); !errors.Is(err, outbox.ErrInvalidIdentifier) {
		t.Errorf("table name with SQL in it: %v", err)
	}
}

type traceKey struct{}

// OnAdd sees each message inside the business transaction's context, and
// what it writes travels with the row to the consumer (a trace context).
func TestOnAddCarriesContextIntoTheRow(t *testing.T) {
	ctx := context.WithValue(context.Background(), traceKey{}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	pool, box, b := setupWith(t, outbox.Options{OnAdd: func(ctx context.Context, m *sdk.Message) {
		if m.ID == "" {
			t.Error("OnAdd before the ID was filled")
		}
		if tp, ok := ctx.Value(traceKey{}).(string); ok {
			m.SetHeader("traceparent", tp)
		}
	}})
	tx, _ := pool.Begin(ctx)
	m := &sdk.Message{Type: "email"}
	if err := box.Add(ctx, tx, "q", m); err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(ctx)
	if _, err := box.RelayOnce(context.Background(), b, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	got := drain(t, b, "q", 1)[m.ID]
	if got == nil || got.Header("traceparent") != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("relayed message %+v lacks the header OnAdd wrote", got)
	}
}

// TestLongKeyRefusedAtAdd: a Key over MaxKeyLength is refused by Add with
// ErrInvalidMessage before any statement, so the business transaction goes
// on. Before, the insert failed with a raw SQLSTATE 54000 (index row size
// exceeds btree maximum 2704, the key index) and aborted the caller's
// transaction. A Key at the bound is stored and relayed.
func TestLongKeyRefusedAtAdd(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	text := func(n int) string { // incompressible: PostgreSQL compresses a repetitive value
		p := make([]byte, n)
		_, _ = crand.Read(p)
		return base64.RawURLEncoding.EncodeToString(p)[:n]
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, n := range []int{outbox.MaxKeyLength + 1, 4000} {
		err = box.Add(ctx, tx, "q", &sdk.Message{Type: "t", Key: text(n)})
		if !errors.Is(err, sdk.ErrInvalidMessage) || strings.Contains(err.Error(), "SQLSTATE") {
			t.Fatalf("Key of %d bytes: %v, want ErrInvalidMessage", n, err)
		}
	}
	m := &sdk.Message{Type: "t", Key: text(outbox.MaxKeyLength)}
	if err := box.Add(ctx, tx, "q", m); err != nil {
		t.Fatalf("Key at the bound, in the same transaction: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := box.RelayOnce(ctx, b, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, b, "q", 1)[m.ID]; got == nil || got.Key != m.Key {
		t.Fatalf("relayed %+v, want the message with its Key", got)
	}
}
