package health_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestReadinessFollowsRabbitMQ: on RabbitMQ a Receive waits through a
// reconnection instead of failing, so readiness comes from the broker's
// ConnectionError. Through integration's fault proxy the server goes away:
// /readyz answers 503 naming the lost connection, /livez stays 200; once
// the broker has reconnected, /readyz answers 200 again and a job published
// then is handled.
func TestReadinessFollowsRabbitMQ(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, u := viaProxy(t, integration.RabbitMQURL(t), "5672")
	opts := rabbitmq.Options{Logger: quiet, ConnectionName: "berth-health-test",
		Reconnect: sdk.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}}
	b, err := rabbitmq.New(ctx, u.String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	queue := "health_" + pgtest.Suffix()
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	deleted := false
	deleteQueue := func() {
		if deleted {
			return
		}
		deleted = true
		if err := b.DeleteQueue(context.Background(), queue); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("delete queue: %v", err)
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
	if h := r.Workers[0]; !strings.HasPrefix(h.Reason, "broker connection down") || h.State != sdk.StateRunning {
		t.Errorf("server away: %+v, want the lost connection as reason", h)
	}
	if err := b.ConnectionError(); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("ConnectionError = %v, want ErrUnavailable", err)
	}
	if code, _ := probe(t, live); code != http.StatusOK {
		t.Errorf("live with the server away = %d, want 200", code)
	}

	proxy.Refuse(false)
	waitProbe(t, ready, http.StatusOK)
	m := &sdk.Message{Type: "ping"}
	if err := b.Publish(ctx, queue, m); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-handled:
		if id != m.ID {
			t.Errorf("handled %s, want %s", id, m.ID)
		}
	case <-ctx.Done():
		t.Fatal("job published after the reconnection not handled")
	}
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
