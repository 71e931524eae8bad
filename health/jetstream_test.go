package health_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/health"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestReadinessFollowsJetStream: with the NATS server taken away through
// integration's fault proxy, /readyz answers 503 naming the connection (the
// broker's ConnectionError) while /livez stays 200; once nats.go has
// reconnected, /readyz answers 200 and a job published then is handled.
func TestReadinessFollowsJetStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, b, queue := proxiedJetStream(ctx, t)
	defer b.Close()
	deleted := false
	deleteQueue := func() {
		if !deleted {
			deleted = true
			if err := b.DeleteQueue(context.Background(), queue); err != nil && !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("delete queue: %v", err)
			}
		}
	}
	defer deleteQueue()

	handled := make(chan string, 4)
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		handled <- d.Message().ID
		return nil
	}), sdk.WorkerOptions{Queue: queue, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	live, ready, stop := runServed(ctx, t, w, true)
	defer stop()

	proxy.Refuse(true)
	proxy.Reset()
	r := waitProbe(t, ready, http.StatusServiceUnavailable)
	if h := r.Workers[0]; h.State != sdk.StateRunning ||
		!(strings.HasPrefix(h.Reason, "broker connection down") || strings.HasPrefix(h.Reason, "receive failing")) {
		t.Errorf("server away: %+v, want the connection or the failing receive as reason", h)
	}
	if err := b.ConnectionError(); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("ConnectionError = %v, want ErrUnavailable", err)
	}
	if code, _ := probe(t, live); code != http.StatusOK {
		t.Errorf("live with the server away = %d, want 200", code)
	}

	proxy.Refuse(false)
	m := &sdk.Message{Type: "ping"}
	deadline := time.Now().Add(30 * time.Second)
	for { // publishes are refused while the connection is down
		err := b.Publish(ctx, queue, m)
		if err == nil {
			break
		}
		if !errors.Is(err, sdk.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("publish after the reconnection: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case id := <-handled:
		if id != m.ID {
			t.Errorf("handled %s, want %s", id, m.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("job published after the reconnection not handled; health %+v", w.Health())
	}
	waitProbe(t, ready, http.StatusOK)
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	deleteQueue()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.ConnectionError(); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("ConnectionError after Close = %v, want ErrClosed", err)
	}
}

// TestProbesAnswerWhileNATSReconnectHangs: with the NATS server behind a
// black hole (new connections accepted, no byte answered), nats.go's
// reconnect holds the connection's lock through its dial and handshake, for
// its Timeout (nats.go's 2 s here; each attempt holds it again). /livez and /readyz
// still answer at once: 200 and 503 naming the connection. Before,
// ConnectionError waited for that lock (nc.Status), so every probe hung
// until the handshake timed out, and a liveness probe's timeout would have
// had the platform kill a process that was only waiting for its server.
func TestProbesAnswerWhileNATSReconnectHangs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, b, queue := proxiedJetStream(ctx, t)
	defer b.Close()
	defer func() {
		if err := b.DeleteQueue(context.Background(), queue); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("delete queue: %v", err)
		}
	}()
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: queue, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	live, ready, stop := runServed(ctx, t, w, true)
	defer stop()

	proxy.Freeze()     // new connections: accepted, never answered
	defer proxy.Thaw() // first: the reconnect completes, Close does not wait for it
	proxy.Reset()
	// Probe for a few seconds: the reconnect's handshake, once it starts,
	// holds the lock for the rest of the test.
	for i := range 30 {
		got := make(chan health.Report, 1)
		go func() { got <- health.Check("ready", w) }()
		select {
		case r := <-got:
			h := r.Workers[0]
			if !h.Live || (i > 0 && h.Ready) { // the first may predate the reset's notice
				t.Fatalf("check %d: %+v, want live and not ready", i, h)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("check %d did not answer in 20s while the reconnect hangs", i)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := probe(t, live); code != http.StatusOK {
		t.Errorf("live = %d, want 200", code)
	}
	if code, r := probe(t, ready); code != http.StatusServiceUnavailable || !strings.HasPrefix(r.Workers[0].Reason, "broker connection down") {
		t.Errorf("ready = %d %+v, want 503 naming the connection", code, r)
	}
	if err := b.ConnectionError(); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("ConnectionError = %v, want ErrUnavailable", err)
	}
}

// proxiedJetStream connects a broker to NATS through integration's fault
// proxy and declares a new queue on it; the caller closes the broker and
// deletes the queue.
func proxiedJetStream(ctx context.Context, t *testing.T) (*integration.Proxy, *jetstream.Broker, string) {
	t.Helper()
	proxy, u := viaProxy(t, integration.NATSURL(t), "4222")
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{Name: "berth-health-test", ReconnectWait: 50 * time.Millisecond},
		jetstream.Options{WaitTime: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	queue := "health_" + pgtest.Suffix()
	if err := b.DeclareQueue(ctx, queue); err != nil {
		b.Close()
		t.Fatal(err)
	}
	return proxy, b, queue
}
