package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stopping publishes through to its broker, then ends the relay's context
// (a shutdown arriving while the broker confirmed), and counts every message
// it passed on.
type stopping struct {
	sdk.Publisher
	stop func()
	mu   sync.Mutex
	sent map[string]int
}

func (s *stopping) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	if err := s.Publisher.Publish(ctx, q, msgs...); err != nil {
		return err
	}
	s.mu.Lock()
	for _, m := range msgs {
		s.sent[m.ID]++
	}
	s.mu.Unlock()
	s.stop()
	return nil
}

// TestStoppedRelayRecordsWhatItPublished: a relay stopped (its ctx ended)
// right after the broker took a batch records it all the same — the rows the
// broker took are deleted, the rows the stop kept from the broker stay as
// they were, not counted as failures — so the next relay publishes each
// message once. Before, the pass rolled back and every message the broker
// had taken was published again at the next start, on every shutdown.
func TestStoppedRelayRecordsWhatItPublished(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	u1, u2 := &sdk.Message{Type: "x"}, &sdk.Message{Type: "x"}
	k1, k2 := &sdk.Message{Type: "x", Key: "k"}, &sdk.Message{Type: "x", Key: "k"}
	add(t, pool, box, "q", u1, u2, k1, k2)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := &stopping{Publisher: b, stop: cancel, sent: map[string]int{}}
	// One round: u1, u2 and k1 in one call, after which the relay stops;
	// k2 waits for k1 and is never tried.
	if _, err := box.RelayOnce(rctx, pub, outbox.RelayOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("RelayOnce stopped during its publish: %v, want context.Canceled", err)
	}
	if pending, err := box.Pending(ctx); err != nil || pending != 1 {
		t.Fatalf("pending after the stopped pass: %d, %v; want 1 (k2): what the broker took is recorded", pending, err)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT attempts FROM `+pgx.Identifier{schema, "berth_outbox"}.Sanitize()+` WHERE message_id = $1`, k2.ID).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Errorf("k2, never tried, has %d attempts counted; want 0", attempts)
	}

	// The next relay publishes what is left, once.
	pub.stop = func() {}
	if n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{}); err != nil || n != 1 {
		t.Fatalf("next pass: %d, %v; want 1 (k2), nil", n, err)
	}
	got := drain(t, b, "q", 4) // fails on a duplicate
	for _, m := range []*sdk.Message{u1, u2, k1, k2} {
		if got[m.ID] == nil {
			t.Errorf("message %s lost", m.ID)
		}
		if n := pub.sent[m.ID]; n != 1 {
			t.Errorf("message %s published %d times, want 1", m.ID, n)
		}
	}
}

// cancelAtDelete ends the relay's context when its pass starts deleting the
// rows the broker took: a stop that lands after the publish, while the pass
// records it.
type cancelAtDelete struct{ cancel func() }

func (c cancelAtDelete) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "DELETE FROM") {
		c.cancel()
	}
	return ctx
}
func (cancelAtDelete) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// refusing refuses every Publish call that holds a message of type "bad".
type refusing struct{ sdk.Publisher }

func (r refusing) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	for _, m := range msgs {
		if m.Type == "bad" {
			return errors.New("refused")
		}
	}
	return r.Publisher.Publish(ctx, q, msgs...)
}

// TestStopWhileRecordingKeepsWhatWasPublished: a stop that lands while the
// pass records its outcome — after the delete of the published rows, before
// the update of the refused ones — still records both: the published row is
// not published again. Before, the update ran on the ended ctx, failed, and
// the whole record was rolled back.
func TestStopWhileRecordingKeepsWhatWasPublished(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	good, bad := &sdk.Message{Type: "x"}, &sdk.Message{Type: "bad"}
	add(t, pool, box, "q", good, bad)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = cancelAtDelete{cancel}
	relayPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer relayPool.Close()
	relayBox, err := outbox.New(relayPool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relayBox.RelayOnce(rctx, refusing{b}, outbox.RelayOptions{}); err == nil {
		t.Fatal("RelayOnce: nil error, want the refusal")
	}
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	left := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT message_id, attempts FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var attempts int
		if err := rows.Scan(&id, &attempts); err != nil {
			t.Fatal(err)
		}
		left[id] = attempts
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok := left[good.ID]; ok || left[bad.ID] != 1 || len(left) != 1 {
		t.Fatalf("rows left (message: attempts) %v; want only the refused one, with 1 attempt (the published one deleted)", left)
	}
	drain(t, b, "q", 1)
}

// lateConfirm is an asynchronous publisher whose broker takes each message
// at once but answers (confirms) a little later, as RabbitMQ's confirms and
// JetStream's acks come a round trip after the send; the relay is stopped
// (its ctx ended) right after the send, before the answer.
type lateConfirm struct {
	sdk.Publisher
	stop func()
	wg   sync.WaitGroup
	mu   sync.Mutex
	sent map[string]int
}

func (l *lateConfirm) PublishAsync(ctx context.Context, q string, m *sdk.Message) (*sdk.PublishResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := l.Publisher.Publish(ctx, q, m); err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.sent[m.ID]++
	l.mu.Unlock()
	res := sdk.NewPublishResult(m.ID)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		time.Sleep(50 * time.Millisecond) // the confirm's round trip
		res.Resolve(nil)
	}()
	l.stop()
	return res, nil
}

// TestStoppedRelayAwaitsConfirmsOfWhatItSent: a relay stopped between
// sending a message through an asynchronous publish and the broker's answer
// still waits (within StopGrace) for that answer and deletes the row the
// broker took, so the next start does not publish it again. Before, the
// wait ended with ctx, the row was left untouched and published twice.
func TestStoppedRelayAwaitsConfirmsOfWhatItSent(t *testing.T) {
	ctx := context.Background()
	pool, box, b, _ := setupSchema(t, outbox.Options{})
	m := &sdk.Message{Type: "x"}
	add(t, pool, box, "q", m)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := &lateConfirm{Publisher: b, stop: cancel, sent: map[string]int{}}
	defer pub.wg.Wait()
	if _, err := box.RelayOnce(rctx, pub, outbox.RelayOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("RelayOnce stopped after its send: %v, want context.Canceled", err)
	}
	pub.stop = func() {}
	if _, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	if pending, err := box.Pending(ctx); err != nil || pending != 0 {
		t.Fatalf("pending %d, %v; want 0", pending, err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if n := pub.sent[m.ID]; n != 1 {
		t.Fatalf("message published %d times, want 1: the broker took it before the stop's grace ended", n)
	}
	drain(t, b, "q", 1)
}
