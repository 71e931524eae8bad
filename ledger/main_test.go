package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

var transport = &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" { // re-executed by TestCrashedWorkerRabbitMQ; SIGKILLed there
		helperProcess()
		os.Exit(0)
	}
	code := m.Run()
	transport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

var quiet = slog.New(slog.DiscardHandler)

func suffix() string {
	var p [6]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// freshSchema returns a schema name of the test's own, dropped at the end.
func freshSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	schema := "berth_ledgertest_" + suffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// newStore returns a migrated ledger store in a fresh schema.
func newStore(t testing.TB, pool *pgxpool.Pool) *pgledger.Store {
	t.Helper()
	s, err := pgledger.New(pool, pgledger.Options{Schema: freshSchema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(testCtx(t, 20*time.Second)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// newLedger returns a ledger on s, closed at the end.
func newLedger(t testing.TB, s ledger.Store, opts ledger.Options) *ledger.Ledger {
	t.Helper()
	opts.Store = s
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	l, err := ledger.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// broker is what the scenarios need of a broker.
type broker interface {
	sdk.Broker
	sdk.DeadLetters
}

// env is one broker under test with its ledger: led is nil on PostgreSQL,
// whose jobs table is read directly.
type env struct {
	name   string
	b      broker
	queue  string
	led    *ledger.Ledger
	reader ledger.Reader
}

// publisher and deadLetters go through the ledger when there is one.
func (e env) publisher() sdk.Publisher {
	if e.led == nil {
		return e.b
	}
	return e.led.Publisher(e.b)
}

func (e env) deadLetters() sdk.DeadLetters {
	if e.led == nil {
		return e.b
	}
	return e.led.DeadLetters(e.b)
}

func (e env) observers() []sdk.Observer {
	if e.led == nil {
		return nil
	}
	return []sdk.Observer{e.led}
}

func memoryEnv(t *testing.T) env {
	b, err := memory.New(memory.Options{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	store := newStore(t, newPool(t))
	return env{name: "memory", b: b, queue: "ledger_" + suffix(), led: newLedger(t, store, ledger.Options{}), reader: store}
}

func rabbitEnv(t testing.TB) env {
	url := integration.RabbitMQURL(t)
	ctx := testCtx(t, 20*time.Second)
	b, err := rabbitmq.New(ctx, url, rabbitmq.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	q := "berth_ledgertest_" + suffix()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.DeleteQueue(ctx, q)
		_ = b.Close()
	})
	store := newStore(t, newPool(t))
	return env{name: "rabbitmq", b: b, queue: q, led: newLedger(t, store, ledger.Options{}), reader: store}
}

func sqsEnv(t *testing.T) env {
	endpoint := integration.SQSEndpoint(t)
	client := awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:  &http.Client{Transport: transport},
	})
	b, err := sqs.New(client, sqs.Options{VisibilityTimeout: 5 * time.Second, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	q := "berth_ledgertest_" + suffix()
	ctx := testCtx(t, 20*time.Second)
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.Flush(ctx)
		_ = b.DeleteQueue(ctx, q, true)
		_ = b.Close()
	})
	store := newStore(t, newPool(t))
	return env{name: "sqs", b: b, queue: q, led: newLedger(t, store, ledger.Options{}), reader: store}
}

func postgresEnv(t *testing.T) env {
	pool := newPool(t)
	schema := freshSchema(t, pool)
	b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Migrate(testCtx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	jobs, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	return env{name: "postgres", b: b, queue: "ledger_" + suffix(), reader: jobs}
}
