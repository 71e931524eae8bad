// Command shop is a small shop service on berth, the scenario a new user
// builds first: an order places a ReserveStock job through the outbox in
// the order's transaction; its handler takes the items from the stock with
// an optimistic update and publishes a SendConfirmation job through the
// outbox in the same transaction; its handler records the email. Both run
// under the PostgreSQL idempotency guard, with telemetry on every step.
//
// The demo places orders for two products from several goroutines, with more
// orders than stock and every ReserveStock job published twice (a checkout
// retried by the client), on the in-memory broker and a PostgreSQL database:
//
//	go run ./examples/shop -postgres 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It prints the orders by status, the stock left, the emails sent (once per
// confirmed order) and what telemetry counted. It works in a schema of its
// own, dropped at the end (Ctrl-C or SIGTERM included).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/examples/internal/demodb"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

func main() {
	dsn := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	orders := flag.Int("orders", 40, "orders to place")
	stock := flag.Int("stock", 15, "items of each of the two products")
	flag.Parse()
	// Ctrl-C or SIGTERM ends the demo with its schema dropped; a second one
	// kills it at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := demo(ctx, *dsn, Config{Orders: *orders, Stock: *stock}, os.Stdout); err != nil {
		if ctx.Err() != nil { // say why: the signal, or the 2 minutes
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		log.Fatal(err)
	}
}

// demo runs the scenario in a fresh schema of the database at dsn.
func demo(ctx context.Context, dsn string, cfg Config, out io.Writer) error {
	pool, schema, done, err := demodb.Open(ctx, dsn, "shop_demo")
	if err != nil {
		return err
	}
	defer done()
	r, err := Run(ctx, pool, schema, cfg)
	if err != nil {
		return err
	}
	r.Print(out)
	return nil
}

// Config is the scenario's size.
type Config struct {
	Orders int // placed from Concurrency goroutines, alternating the two products
	Stock  int // items of each product
}

// Report is what the scenario ends with.
type Report struct {
	Totals
	Placed, Products int
	Settlements      map[sdk.Action]int
	Spans            map[string]int   // ended spans by name
	Metrics          map[string]int64 // counters by name, summed
}

// Print writes the report.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "orders placed: %d\n", r.Placed)
	for _, st := range []string{"confirmed", "rejected", "reserved", "placed"} {
		fmt.Fprintf(w, "  %-9s %d\n", st, r.Orders[st])
	}
	skus := make([]string, 0, len(r.Available))
	for s := range r.Available {
		skus = append(skus, s)
	}
	sort.Strings(skus)
	for _, s := range skus {
		fmt.Fprintf(w, "stock left %s: %d\n", s, r.Available[s])
	}
	fmt.Fprintf(w, "emails sent: %d (orders emailed twice: %d)\n", r.Emails, r.EmailDups)
	fmt.Fprintf(w, "settlements: %v\n", r.Settlements)
	for _, name := range []string{"messaging.client.sent.messages", "berth.idempotency.duplicates", "berth.concurrency.version_conflicts"} {
		fmt.Fprintf(w, "%s: %d\n", name, r.Metrics[name])
	}
	fmt.Fprintf(w, "spans: send %d, process %d\n", r.Spans["send "+Queue], r.Spans["process "+Queue])
}

// Run places cfg.Orders orders on a shop in pool (whose search_path is
// schema), on the in-memory broker, and returns once every order is
// confirmed or rejected and every job settled.
func Run(ctx context.Context, pool *pgxpool.Pool, schema string, cfg Config) (Report, error) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // in-memory
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // in-memory
	broker, err := memory.New(memory.Options{Lease: 10 * time.Second})
	if err != nil {
		return Report{}, err
	}
	defer broker.Close()
	tel, err := telemetry.New(telemetry.Options{TracerProvider: tp, MeterProvider: mp,
		JobTypes: []string{ReserveStock{}.Kind(), SendConfirmation{}.Kind()}})
	if err != nil {
		return Report{}, err
	}
	defer tel.Close()
	quiet := slog.New(slog.DiscardHandler)

	shop, err := NewShop(pool, schema, tel, quiet)
	if err != nil {
		return Report{}, err
	}
	if err := shop.Migrate(ctx); err != nil {
		return Report{}, err
	}
	skus := []string{"kettle", "teapot"}
	for _, sku := range skus {
		if err := shop.AddProduct(ctx, sku, cfg.Stock); err != nil {
			return Report{}, err
		}
	}

	var mu sync.Mutex
	settled := map[sdk.Action]int{}
	var finished atomic.Int64
	count := settleFunc(func(s sdk.Settlement) {
		mu.Lock()
		settled[s.Action]++
		mu.Unlock()
		if s.Action == sdk.ActionAck || s.Action == sdk.ActionDeadLetter {
			finished.Add(1)
		}
	})
	w, err := sdk.NewWorker(broker, shop.Router(), sdk.WorkerOptions{
		Queue: Queue, Concurrency: 8, Logger: quiet,
		Middleware: []sdk.Middleware{shop.Guard()},
		Observers:  []sdk.Observer{tel, count},
		Retry:      sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: 10 * time.Millisecond, Max: 200 * time.Millisecond}},
	})
	if err != nil {
		return Report{}, err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs <- w.Run(wctx) }()
	go func() {
		defer wg.Done()
		// Through tel.Publisher the relay keeps a broker's own asynchronous
		// publish (RabbitMQ, JetStream: every row of a pass in flight); the
		// memory broker has none, so it publishes each pass in batches.
		err := shop.Outbox().Relay(wctx, tel.Publisher(broker), outbox.RelayOptions{PollInterval: 10 * time.Millisecond, Logger: quiet})
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		errs <- err
	}()
	shutdown := func() error {
		stop()
		wg.Wait()
		close(errs)
		var all error
		for err := range errs {
			all = errors.Join(all, err)
		}
		return all
	}

	// Customers check out from several goroutines; each checkout is retried
	// once by its client, publishing its ReserveStock job a second time.
	checkout := tp.Tracer("shop").Start
	var place sync.WaitGroup
	placeErrs := make(chan error, cfg.Orders)
	for i := range cfg.Orders {
		place.Add(1)
		go func() {
			defer place.Done()
			id, sku := fmt.Sprintf("order_%03d", i), skus[i%len(skus)]
			octx, span := checkout(ctx, "checkout")
			defer span.End()
			if err := shop.PlaceOrder(octx, id, sku, 1, id+"@example.com"); err != nil {
				placeErrs <- err
				return
			}
			m, err := sdk.NewJob(ReserveStock{OrderID: id, SKU: sku, Qty: 1})
			if err == nil {
				err = tel.Publisher(broker).Publish(octx, Queue, m) // the client's retry
			}
			if err != nil {
				placeErrs <- err
			}
		}()
	}
	place.Wait()
	close(placeErrs)
	for err := range placeErrs {
		if err != nil {
			return Report{}, errors.Join(err, shutdown())
		}
	}

	// Every order ends confirmed or rejected; the jobs to finish are two
	// ReserveStock per order and one SendConfirmation per confirmed order.
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var totals Totals
	for {
		totals, err = shop.Totals(ctx)
		if err != nil {
			return Report{}, errors.Join(err, shutdown())
		}
		want := int64(2*cfg.Orders + totals.Orders["confirmed"])
		if totals.Orders["confirmed"]+totals.Orders["rejected"] == cfg.Orders && finished.Load() >= want {
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return Report{}, errors.Join(fmt.Errorf("shop: not done after a minute: %+v, %d jobs finished", totals, finished.Load()), shutdown())
		case <-ctx.Done():
			return Report{}, errors.Join(ctx.Err(), shutdown())
		}
	}
	if err := shutdown(); err != nil {
		return Report{}, err
	}

	r := Report{Totals: totals, Placed: cfg.Orders, Products: len(skus), Settlements: settled, Spans: map[string]int{}, Metrics: map[string]int64{}}
	for _, s := range spans.Ended() {
		r.Spans[s.Name()]++
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return r, err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					r.Metrics[m.Name] += dp.Value
				}
			}
		}
	}
	return r, nil
}

// settleFunc is an sdk.Observer calling itself with each settlement.
type settleFunc func(sdk.Settlement)

func (f settleFunc) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (f settleFunc) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) { f(s) }
