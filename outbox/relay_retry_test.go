package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// slowRefusing refuses every message after a slow round trip.
type slowRefusing struct {
	sdk.Publisher
	delay time.Duration
}

var errRefused = errors.New("refused")

func (s *slowRefusing) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	time.Sleep(s.delay)
	return errRefused
}

// A row refused after a slow publish waits its whole backoff from the
// refusal, not from the start of the relay's transaction.
func TestBackoffCountsFromTheFailureNotTheTxStart(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	pub := &slowRefusing{Publisher: b, delay: 500 * time.Millisecond}
	opts := outbox.RelayOptions{Backoff: sdk.Backoff{Base: 400 * time.Millisecond, Max: 400 * time.Millisecond, Jitter: -1}, MaxAttempts: 100}
	if _, err := box.RelayOnce(ctx, pub, opts); !errors.Is(err, errRefused) {
		t.Fatalf("RelayOnce = %v, want the refusal", err)
	}
	var due bool
	if err := pool.QueryRow(ctx, `SELECT available_at <= clock_timestamp() FROM `+pgx.Identifier{schema, "berth_outbox"}.Sanitize()).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due {
		t.Fatal("the row is due again right after its refusal: its 400ms backoff was spent inside the 500ms publish")
	}
}

// flaky is down (ErrUnavailable) for down calls, then refuses once, then accepts.
type flaky struct {
	sdk.Publisher
	mu      sync.Mutex
	down    int
	refused bool
}

func (f *flaky) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down > 0 {
		f.down--
		return fmt.Errorf("%w: down", sdk.ErrUnavailable)
	}
	if !f.refused {
		f.refused = true
		return errRefused
	}
	return f.Publisher.Publish(ctx, q, msgs...)
}

// An outage never parks a row: after the broker comes back, the row still
// gets MaxAttempts refusals before it is parked.
func TestOutageDoesNotUseUpAttempts(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	add(t, pool, box, "q", &sdk.Message{ID: "m1"})
	pub := &flaky{Publisher: b, down: 5}
	opts := outbox.RelayOptions{Backoff: fast, MaxAttempts: 3}
	for range 6 {
		_, _ = box.RelayOnce(ctx, pub, opts)
		time.Sleep(5 * time.Millisecond)
	}
	if p, _ := box.Parked(ctx, 0); len(p) != 0 {
		t.Fatalf("row parked after one refusal (attempts %d, %q): the outage used up its MaxAttempts", p[0].Attempts, p[0].LastError)
	}
	relayUntil(t, box, pub, opts, "published", func() bool { n, _ := box.Pending(ctx); return n == 0 })
	drain(t, b, "q", 1)
}
