package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/internal/demotest"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// runMainEnv makes the test binary run the command's main instead of the
// tests (TestInterruptDropsSchema's child process).
const runMainEnv = "BERTH_SHOP_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// newTestShop is a migrated shop in a schema of the test's own, with
// telemetry recording into spans.
func newTestShop(t *testing.T) (*Shop, *telemetry.Observer, *tracetest.SpanRecorder) {
	t.Helper()
	pool, schema := pgtest.Schema(t, 8)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tel, err := telemetry.New(telemetry.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Close() })
	shop, err := NewShop(pool, schema, tel, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return shop, tel, spans
}

// TestReserveStockSettlement runs the ReserveStock handler under the guard
// through the Worker's settlement rules, one job at a time: a reservation,
// its duplicate (acked, no second effect), an order the stock cannot serve
// (rejected, acked), an unknown product and an undecodable body (both
// dead-lettered at once).
func TestReserveStockSettlement(t *testing.T) {
	shop, _, _ := newTestShop(t)
	ctx := context.Background()
	if err := shop.AddProduct(ctx, "kettle", 1); err != nil {
		t.Fatal(err)
	}
	guarded := sdk.Chain(shop.Router(), shop.Guard())
	for _, id := range []string{"o1", "o2", "o3"} {
		if err := shop.PlaceOrder(ctx, id, "kettle", 1, id+"@example.com"); err != nil {
			t.Fatal(err)
		}
	}
	job := func(a ReserveStock) *sdk.Message {
		m, err := sdk.NewJob(a)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	if r := berthtest.Work(t, guarded, job(ReserveStock{OrderID: "o1", SKU: "kettle", Qty: 1})); !r.Acked() {
		t.Fatalf("reservation: %s (%v)", r.Action, r.Cause)
	}
	if r := berthtest.Work(t, guarded, job(ReserveStock{OrderID: "o1", SKU: "kettle", Qty: 1}), berthtest.Attempt(2)); !r.Acked() {
		t.Fatalf("duplicate: %s (%v)", r.Action, r.Cause)
	}
	if r := berthtest.Work(t, guarded, job(ReserveStock{OrderID: "o2", SKU: "kettle", Qty: 1})); !r.Acked() {
		t.Fatalf("out of stock: %s (%v), want acked (the order is rejected)", r.Action, r.Cause)
	}
	r := berthtest.Work(t, guarded, job(ReserveStock{OrderID: "o3", SKU: "teapot", Qty: 1}))
	if !r.DeadLettered() || r.Class != sdk.ClassPermanent {
		t.Fatalf("unknown product: %s %s (%v), want a permanent dead letter", r.Action, r.Class, r.Cause)
	}
	bad := &sdk.Message{Type: ReserveStock{}.Kind(), IdempotencyKey: "reserve:o9:v1", Body: []byte(`{"qty":"one"}`)}
	if r := berthtest.Work(t, guarded, bad); !r.DeadLettered() || !strings.Contains(r.Reason, "undecodable") {
		t.Fatalf("undecodable: %s %q", r.Action, r.Reason)
	}

	tot, err := shop.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Orders["reserved"] != 1 || tot.Orders["rejected"] != 1 || tot.Orders["placed"] != 1 || tot.Available["kettle"] != 0 {
		t.Fatalf("totals %+v: want o1 reserved once, o2 rejected, o3 untouched, no kettle left", tot)
	}
	// o1's confirmation waits in the outbox, once: the duplicate wrote none.
	if n, err := shop.Outbox().Pending(ctx); err != nil || n != 4 { // 3 ReserveStock from PlaceOrder + 1 confirmation
		t.Fatalf("outbox holds %d rows (%v), want 4", n, err)
	}
}

// TestSendConfirmationOnce: the confirmation, delivered twice, sends one
// email and confirms the order.
func TestSendConfirmationOnce(t *testing.T) {
	shop, _, _ := newTestShop(t)
	ctx := context.Background()
	if err := shop.AddProduct(ctx, "kettle", 1); err != nil {
		t.Fatal(err)
	}
	if err := shop.PlaceOrder(ctx, "o1", "kettle", 1, "o1@example.com"); err != nil {
		t.Fatal(err)
	}
	guarded := sdk.Chain(shop.Router(), shop.Guard())
	m, _ := sdk.NewJob(ReserveStock{OrderID: "o1", SKU: "kettle", Qty: 1})
	if r := berthtest.Work(t, guarded, m); !r.Acked() {
		t.Fatal(r.Action, r.Cause)
	}
	for range 2 {
		c, _ := sdk.NewJob(SendConfirmation{OrderID: "o1", Email: "o1@example.com"})
		if r := berthtest.Work(t, guarded, c); !r.Acked() {
			t.Fatal(r.Action, r.Cause)
		}
	}
	tot, err := shop.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Emails != 1 || tot.Orders["confirmed"] != 1 {
		t.Fatalf("totals %+v, want one email and the order confirmed", tot)
	}
}

// TestShopOnMemoryBroker: orders placed concurrently, with every
// ReserveStock published twice, end confirmed while stock lasts and
// rejected after, with no oversell, one email per confirmed order, and one
// trace from each checkout through the outbox to the email.
func TestShopOnMemoryBroker(t *testing.T) {
	const orders, stock = 12, 4
	shop, tel, spans := newTestShop(t)
	ctx := context.Background()
	for _, sku := range []string{"kettle", "teapot"} {
		if err := shop.AddProduct(ctx, sku, stock); err != nil {
			t.Fatal(err)
		}
	}
	b := berthtest.Memory(t)
	rec := berthtest.StartWorker(t, b, shop.Router(), sdk.WorkerOptions{
		Queue: Queue, Concurrency: 6,
		Middleware: []sdk.Middleware{shop.Guard()},
		Observers:  []sdk.Observer{tel},
		Retry:      sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}},
	})
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() {
		relayDone <- shop.Outbox().Relay(relayCtx, tel.Publisher(b), outbox.RelayOptions{PollInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()
	t.Cleanup(func() { stopRelay(); <-relayDone })

	for i := range orders {
		id, sku := "o"+string(rune('a'+i)), []string{"kettle", "teapot"}[i%2]
		if err := shop.PlaceOrder(ctx, id, sku, 1, id+"@example.com"); err != nil {
			t.Fatal(err)
		}
		dup, _ := sdk.NewJob(ReserveStock{OrderID: id, SKU: sku, Qty: 1})
		if err := tel.Publisher(b).Publish(ctx, Queue, dup); err != nil {
			t.Fatal(err)
		}
	}
	// Two ReserveStock per order, one SendConfirmation per confirmed order.
	done := rec.WaitDone(t, 2*orders+2*stock)
	for _, r := range done {
		if r.Action != sdk.ActionAck {
			t.Errorf("%s %s finished with %s (%v)", r.Message.Type, r.Message.ID, r.Action, r.Cause)
		}
	}
	tot, err := shop.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Orders["confirmed"] != 2*stock || tot.Orders["rejected"] != orders-2*stock {
		t.Errorf("orders %v, want %d confirmed and %d rejected", tot.Orders, 2*stock, orders-2*stock)
	}
	if tot.Available["kettle"] != 0 || tot.Available["teapot"] != 0 {
		t.Errorf("stock left %v, want none and never below", tot.Available)
	}
	if tot.Emails != 2*stock || tot.EmailDups != 0 {
		t.Errorf("%d emails (%d duplicated), want %d, once each", tot.Emails, tot.EmailDups, 2*stock)
	}
	// Each confirmation's processing is in the trace its order's
	// transaction started.
	sendTraces := map[string]bool{}
	for _, s := range spans.Ended() {
		if s.Name() == "send "+Queue {
			sendTraces[s.SpanContext().TraceID().String()] = true
		}
	}
	confirmations, confirmKind := 0, sdk.KindOf[SendConfirmation]()
	for _, s := range spans.Ended() {
		if s.Name() != "process "+Queue {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == telemetry.AttrJobType && a.Value.AsString() == confirmKind {
				confirmations++
				if !sendTraces[s.SpanContext().TraceID().String()] {
					t.Errorf("confirmation processed in trace %s, which no send span started", s.SpanContext().TraceID())
				}
			}
		}
	}
	if confirmations != 2*stock {
		t.Errorf("%d confirmation process spans, want %d", confirmations, 2*stock)
	}
}

// TestRun runs the demo's scenario and checks its report.
func TestRun(t *testing.T) {
	pool, schema := pgtest.Schema(t, 12)
	r, err := Run(context.Background(), pool, schema, Config{Orders: 10, Stock: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r.Orders["confirmed"] != 6 || r.Orders["rejected"] != 4 || r.Emails != 6 || r.EmailDups != 0 {
		t.Fatalf("report %+v", r)
	}
	if r.Metrics["berth.idempotency.duplicates"] != 10 {
		t.Errorf("duplicates suppressed %d, want 10 (each order's republished job)", r.Metrics["berth.idempotency.duplicates"])
	}
	var out bytes.Buffer
	r.Print(&out)
	if !strings.Contains(out.String(), "emails sent: 6 (orders emailed twice: 0)") {
		t.Errorf("report:\n%s", out.String())
	}
}

// TestInterruptDropsSchema: Ctrl-C (SIGINT) while the demo runs ends it with
// an error, its schema dropped, as the command's doc promises ("dropped at
// the end"), instead of killing it with the schema left behind.
func TestInterruptDropsSchema(t *testing.T) {
	db, _ := pgtest.Schema(t, 2)
	dsn := db.Config().ConnString() // the database's, without the schema
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Enough orders that the demo is still placing them when it is interrupted.
	cmd := exec.Command(os.Args[0], "-postgres", dsn, "-orders", "10000", "-stock", "10")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	demotest.SignalDropsSchema(ctx, t, db, `^shop_demo_`, cmd, os.Interrupt, "interrupt signal received")
}
