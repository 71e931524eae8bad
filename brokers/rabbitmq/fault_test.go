package rabbitmq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// publishAll publishes msgs in batches of batch, republishing whatever
// failed until the server confirmed every message; after the batch numbered
// cutAfter it calls cut. It returns how many publishes failed on the way.
func publishAll(t *testing.T, ctx context.Context, b *Broker, q string, msgs []*sdk.Message, batch, cutAfter int, cut func()) int {
	t.Helper()
	failures := 0
	for i, n := 0, 0; i < len(msgs); i, n = i+batch, n+1 {
		pending := msgs[i:min(i+batch, len(msgs))]
		for len(pending) > 0 {
			err := b.Publish(ctx, q, pending...)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("publishing: %v", err)
			}
			failures++
			var pe *sdk.PublishError
			if !errors.As(err, &pe) {
				if !errors.Is(err, sdk.ErrUnavailable) {
					t.Fatalf("Publish failed with %v, want an error wrapping ErrUnavailable", err)
				}
				continue // nothing was sent: all again
			}
			var again []*sdk.Message
			for _, m := range pending {
				if cause, failed := pe.Failed[m.ID]; failed {
					if !errors.Is(cause, sdk.ErrUnavailable) {
						t.Fatalf("message %s failed with %v, want an error wrapping ErrUnavailable", m.ID, cause)
					}
					again = append(again, m)
				}
			}
			pending = again
		}
		if n == cutAfter {
			cut()
		}
	}
	return failures
}

// TestConnectionCutMidRun cuts every connection (publishing and consuming)
// four times in the middle of a 5,000-message run, between and during
// publishes and acks: every confirmed message is
// processed, none is lost, and duplicates come only from deliveries whose
// ack the cut swallowed.
func TestConnectionCutMidRun(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b := newBroker(t, purl, Options{Prefetch: 100, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}

	const total = 5000
	msgs := make([]*sdk.Message, total)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "fault.cut", Body: []byte(strconv.Itoa(i))}
	}
	var (
		mu        sync.Mutex
		processed = map[string]int{}
		allDone   = make(chan struct{})
	)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		id := d.Message().ID
		processed[id]++
		if n := len(processed); processed[id] == 1 && (n == total/5 || n == total/2 || n == 4*total/5) {
			p.Cut() // while publishes and acks are in flight
		}
		if len(processed) == total {
			select {
			case <-allDone:
			default:
				close(allDone)
			}
		}
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- w.Run(wctx) }()

	failures := publishAll(t, ctx, b, q, msgs, 100, total/100/3, p.Cut)
	select {
	case <-allDone:
	case <-ctx.Done():
		mu.Lock()
		info, err := b.Info(context.Background(), q)
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatalf("%d of %d confirmed messages processed; queue now %+v (%v)", len(processed), total, info, err)
	}
	stop()
	if err := <-werr; err != nil {
		t.Fatalf("Worker.Run: %v", err)
	}
	if info, err := b.Info(ctx, q); err != nil || info.DeadLettered != 0 {
		t.Errorf("after the run: %+v, %v; want nothing dead-lettered", info, err)
	}
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, m := range msgs {
		if processed[m.ID] == 0 {
			t.Errorf("confirmed message %s never processed", m.ID)
		}
		dups += processed[m.ID] - 1
	}
	t.Logf("%d messages, %d failed publishes retried, %d duplicate deliveries", total, failures, dups)
}

// TestPublishWaitsDuringOutage: with the server unreachable, Publish waits
// for the reconnection bounded by ctx and then fails with an error wrapping
// sdk.ErrUnavailable; once the server is back it publishes again.
func TestPublishWaitsDuringOutage(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b := newBroker(t, purl, Options{Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx := t.Context()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	p.Cut()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := b.Publish(short, q, &sdk.Message{Type: "outage"})
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Publish during an outage: %v, want ErrUnavailable", err)
	}
	p.Refuse(false)
	m := &sdk.Message{Type: "after-outage"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatalf("Publish after the outage: %v", err)
	}
	ds, err := b.Receive(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].Message().ID != m.ID {
		t.Fatalf("after the outage received %d deliveries, want only %s", len(ds), m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSettleAfterChannelLoss: deliveries whose connection died are not
// settled on the new connection: Ack, Retry and DeadLetter report
// ErrLeaseLost and publish nothing, and the messages come back with their
// attempt counted.
func TestSettleAfterChannelLoss(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b := newBroker(t, purl, Options{Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	msgs := []*sdk.Message{{Type: "lost-ack"}, {Type: "lost-retry"}, {Type: "lost-dead"}}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var old []sdk.Delivery
	for len(old) < len(msgs) {
		ds, err := b.Receive(ctx, q, len(msgs)-len(old))
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, ds...)
	}
	p.Cut()
	// An ack written before the client notices the cut is lost with the
	// connection (the server requeues the message); wait until it notices.
	for !errors.Is(old[0].ExtendLease(ctx, time.Second), sdk.ErrLeaseLost) {
		if ctx.Err() != nil {
			t.Fatal("the broker never noticed the cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, settle := range []func(d sdk.Delivery) error{
		func(d sdk.Delivery) error { return d.Ack(ctx) },
		func(d sdk.Delivery) error { return d.Retry(ctx, 0, errors.New("boom")) },
		func(d sdk.Delivery) error { return d.DeadLetter(ctx, errors.New("boom")) },
	} {
		if err := settle(old[i]); !errors.Is(err, sdk.ErrLeaseLost) {
			t.Errorf("settlement %d of a delivery from a dead channel: %v, want ErrLeaseLost", i, err)
		}
	}
	got := map[string]int{}
	for len(got) < len(msgs) {
		ds, err := b.Receive(ctx, q, len(msgs))
		if err != nil {
			t.Fatalf("Receive after the cut: %v (got %v)", err, got)
		}
		for _, d := range ds {
			if _, dup := got[d.Message().ID]; dup {
				t.Errorf("message %s delivered twice after the cut: a stale settlement published a copy", d.Message().ID)
			}
			got[d.Message().ID] = d.Attempt()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range msgs {
		if got[m.ID] != 2 {
			t.Errorf("message %s back at attempt %d, want 2", m.ID, got[m.ID])
		}
	}
	if info, err := b.Info(ctx, q); err != nil || info.DeadLettered != 0 || info.Ready != 0 {
		t.Errorf("after settling: %+v, %v; want an empty queue and no dead letter", info, err)
	}
}

// TestServerClosesConnection: the server force-closes both connections
// (rabbitmqctl close_connection, found by their client-provided names); the
// broker reconnects and keeps publishing and consuming.
func TestServerClosesConnection(t *testing.T) {
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Skip("rabbitmqctl not on PATH: the server is not local (TestConnectionCutMidRun covers a cut through a proxy)")
	}
	url := serverURL(t)
	q := testQueue(t, url)
	name := "berth-test-" + q
	b := newBroker(t, url, Options{ConnectionName: name, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	first := &sdk.Message{Type: "before"}
	if err := b.Publish(ctx, q, first); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	held := ds[0]
	for _, suffix := range []string{"-publish", "-consume"} {
		closeConnection(t, ctx, ctl, name+suffix)
	}
	for !errors.Is(held.ExtendLease(ctx, time.Second), sdk.ErrLeaseLost) {
		if ctx.Err() != nil {
			t.Fatal("the broker never noticed the closed connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := held.Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("Ack after the server closed the connection: %v, want ErrLeaseLost", err)
	}
	second := &sdk.Message{Type: "after"}
	if err := b.Publish(ctx, q, second); err != nil {
		t.Fatalf("Publish after the server closed the connection: %v", err)
	}
	got := map[string]int{}
	for len(got) < 2 {
		ds, err := b.Receive(ctx, q, 2)
		if err != nil {
			t.Fatalf("Receive after reconnecting: %v (got %v)", err, got)
		}
		for _, d := range ds {
			got[d.Message().ID] = d.Attempt()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got[first.ID] != 2 || got[second.ID] != 1 {
		t.Errorf("attempts after reconnecting: %v, want %s:2 and %s:1", got, first.ID, second.ID)
	}
}

// closeConnection asks the server to close the connection named name.
func closeConnection(t *testing.T, ctx context.Context, ctl, name string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, ctl, "-q", "list_connections", "pid", "client_properties").Output()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, `"`+name+`"`) {
			continue
		}
		pid := strings.Fields(line)[0]
		if out, err := exec.CommandContext(ctx, ctl, "close_connection", pid, "berth fault test").CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl close_connection: %v: %s", err, out)
		}
		return
	}
	t.Fatalf("no connection named %q in:\n%s", name, out)
}
