package health_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestReadinessFollowsPostgres runs a Worker on the PostgreSQL broker
// through integration's fault proxy and takes the database away: readiness drops to 503 with
// the receive error while liveness stays 200; once the database is back and
// a job arrives, readiness returns to 200.
func TestReadinessFollowsPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct, schema := pgtest.Schema(t, 4)
	producer, err := postgres.New(direct, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if err := producer.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	proxy, u := viaProxy(t, integration.PostgresDSN(t), "5432")
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 4
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	consumer, err := postgres.New(proxied, postgres.Options{Schema: schema, PollInterval: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()

	handled := make(chan string, 4)
	w, err := sdk.NewWorker(consumer, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		handled <- d.Message().ID
		return nil
	}), sdk.WorkerOptions{Queue: "health", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	live, ready, stop := runServed(ctx, t, w, false)
	defer stop()

	publish := func() {
		t.Helper()
		m := &sdk.Message{Type: "ping"}
		if err := producer.Publish(ctx, "health", m); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-handled:
			if id != m.ID {
				t.Fatalf("handled %s, want %s", id, m.ID)
			}
		case <-ctx.Done():
			t.Fatal("job not handled")
		}
	}
	publish()
	r := waitProbe(t, ready, http.StatusOK)
	if r.Workers[0].LastReceive.IsZero() {
		t.Errorf("ready without a last receive: %+v", r.Workers[0])
	}

	proxy.Refuse(true) // the database goes away: connections cut, new ones refused
	proxy.Reset()
	r = waitProbe(t, ready, http.StatusServiceUnavailable)
	h := r.Workers[0]
	if h.ReceiveFailures == 0 || h.LastReceiveError == "" || !strings.HasPrefix(h.Reason, "receive failing") {
		t.Errorf("database away: %+v, want receive failures with the error as reason", h)
	}
	if code, r := probe(t, live); code != http.StatusOK || r.Workers[0].State != sdk.StateRunning {
		t.Errorf("live with the database away = %d %+v, want 200: the run loop is alive", code, r)
	}

	proxy.Refuse(false)
	publish() // a Receive that returns a job is the proof the broker works again
	r = waitProbe(t, ready, http.StatusOK)
	if h := r.Workers[0]; h.ReceiveFailures != 0 || h.LastReceive.Before(h.LastReceiveErrorAt) {
		t.Errorf("recovered: %+v", h)
	}

	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	waitProbe(t, live, http.StatusServiceUnavailable)
}
