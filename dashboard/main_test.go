package dashboard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broker is what the tests need of a broker.
type broker interface {
	sdk.Broker
	sdk.Inspector
	sdk.DeadLetters
}

func memoryBroker(t *testing.T) broker {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func postgresBroker(t *testing.T) broker {
	b, _ := postgresBrokerPool(t)
	return b
}

// postgresBrokerPool is postgresBroker with its pool.
func postgresBrokerPool(t *testing.T) (*postgres.Broker, *pgxpool.Pool) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("dashboard_test_%d", rand.Uint64()%1e12)
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return b, pool
}

// seed puts n dead letters and ready ready messages on queue "billing":
// dead letter i has type billing.refund when i%4 == 3 (else billing.charge)
// and failed transiently with "gateway timeout i" when i%3 == 0, else
// permanently with "card i declined".
func seed(t *testing.T, b broker, n, ready int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		typ := "billing.charge"
		if i%4 == 3 {
			typ = "billing.refund"
		}
		m := &sdk.Message{Type: typ, Body: fmt.Appendf(nil, `{"order":"o-%d","amount_cents":%d}`, i, 100*i)}
		if err := b.Publish(ctx, "billing", m); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive %d %v", len(ds), err)
		}
		cause := sdk.Permanent(fmt.Errorf("card %d declined", i))
		if i%3 == 0 {
			cause = fmt.Errorf("gateway timeout %d", i)
		}
		if err := ds[0].DeadLetter(ctx, cause); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	for i := range ready {
		if err := b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: fmt.Appendf(nil, `{"ready":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func serve(t *testing.T, b broker, o dashboard.Options) *httptest.Server {
	t.Helper()
	d, err := dashboard.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return srv
}

func stats(t *testing.T, b broker) sdk.QueueStats {
	t.Helper()
	st, err := b.Stats(context.Background(), "billing")
	if err != nil {
		t.Fatal(err)
	}
	return st
}
