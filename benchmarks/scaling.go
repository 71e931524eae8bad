package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"image/color"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/sdk"
)

// plotDir is where the PNGs go; empty: no plots (stdout run).
var plotDir string

// target is one broker of the scaling curves.
type target struct {
	name  string
	open  func(ctx context.Context) (sdk.Broker, func(queue string), error)
	sizes []int // message sizes it takes
}

func natsURL() string {
	if u := os.Getenv("BERTH_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func targets(pool *pgxpool.Pool, schema string) []target {
	quiet := slog.New(slog.DiscardHandler)
	all := []int{256, 4 << 10, 64 << 10, 255 << 10}
	return []target{
		{"memory", func(context.Context) (sdk.Broker, func(string), error) {
			b, err := memory.New(memory.Options{})
			return b, func(string) {}, err
		}, all},
		{"RabbitMQ (quorum)", func(ctx context.Context) (sdk.Broker, func(string), error) {
			b, err := rabbitmq.New(ctx, rabbitURL(), rabbitmq.Options{QueueType: rabbitmq.Quorum, Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			return b, func(q string) { _ = b.DeleteQueue(context.Background(), q) }, nil
		}, all},
		{"JetStream", func(ctx context.Context) (sdk.Broker, func(string), error) {
			b, err := jetstream.Connect(ctx, natsURL(), jetstream.ConnectOptions{}, jetstream.Options{Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			return b, func(q string) { _ = b.DeleteQueue(context.Background(), q) }, nil
		}, []int{256, 4 << 10, 64 << 10, 255 << 10}},
		{"PostgreSQL", func(ctx context.Context) (sdk.Broker, func(string), error) {
			b, err := postgres.New(pool, postgres.Options{Schema: schema, PollInterval: 20 * time.Millisecond, Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			if err := b.Migrate(ctx); err != nil {
				return nil, nil, err
			}
			return b, func(string) {}, nil
		}, all},
	}
}

var concurrencies = []int{1, 2, 4, 8, 16, 32, 64}

// curve is one broker's line on a plot.
type curve struct {
	name string
	xs   []float64
	ys   []float64
}

func runScaling(ctx context.Context, c config) ([]table, error) {
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	schema := fmt.Sprintf("berthbench_s%d", time.Now().UnixNano()%1e9)
	defer func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	n := msgs(c, 2000)
	var pubCurves, conCurves, sizeCurves []curve
	latRows := [][]string{}
	type lat struct {
		name     string
		p50, p99 time.Duration
	}
	var lats []lat
	rate := 200
	latFor := 5 * time.Second
	if c.quick {
		latFor = time.Second
	}
	seq := 0
	for _, t := range targets(pool, schema) {
		fmt.Fprintf(os.Stderr, "berthbench: scaling %s\n", t.name)
		b, drop, err := t.open(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		newQueue := func() (string, error) {
			seq++
			q := fmt.Sprintf("scale_%d_%d", time.Now().UnixNano()%1e6, seq)
			if d, ok := b.(sdk.QueueDeclarer); ok {
				if err := d.DeclareQueue(ctx, q); err != nil {
					return "", err
				}
			}
			return q, nil
		}
		var queues []string
		fail := func(err error) ([]table, error) {
			for _, q := range queues {
				drop(q)
			}
			_ = b.Close()
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		pub, con, size := curve{name: t.name}, curve{name: t.name}, curve{name: t.name}
		for _, k := range concurrencies {
			q, err := newQueue()
			if err != nil {
				return fail(err)
			}
			queues = append(queues, q)
			d, err := timed(func() error {
				return callers(k, n, func() error { return b.Publish(ctx, q, &sdk.Message{Type: "bench", Body: make([]byte, bodySize)}) })
			})
			if err != nil {
				return fail(err)
			}
			pub.xs, pub.ys = append(pub.xs, float64(k)), append(pub.ys, float64(n)/d.Seconds())
			// The same n messages, now waiting, consumed by a Worker of
			// Concurrency k.
			d, err = consume(ctx, b, q, k, n, nil)
			if err != nil {
				return fail(err)
			}
			con.xs, con.ys = append(con.xs, float64(k)), append(con.ys, float64(n)/d.Seconds())
		}
		for _, sz := range t.sizes {
			q, err := newQueue()
			if err != nil {
				return fail(err)
			}
			queues = append(queues, q)
			m := max(n*256/sz, 50) // fewer big messages
			if c.quick {
				m = max(m/4, 20)
			}
			d, err := endToEnd(ctx, b, q, sz, m)
			if err != nil {
				return fail(fmt.Errorf("size %d: %w", sz, err))
			}
			size.xs, size.ys = append(size.xs, float64(sz)), append(size.ys, float64(m)/d.Seconds())
		}
		q, err := newQueue()
		if err != nil {
			return fail(err)
		}
		queues = append(queues, q)
		p50, p99, err := latency(ctx, b, q, rate, latFor)
		if err != nil {
			return fail(fmt.Errorf("latency: %w", err))
		}
		lats = append(lats, lat{t.name, p50, p99})
		latRows = append(latRows, []string{t.name, p50.Round(10 * time.Microsecond).String(), p99.Round(10 * time.Microsecond).String()})
		for _, q := range queues {
			drop(q)
		}
		_ = b.Close()
		pubCurves, conCurves, sizeCurves = append(pubCurves, pub), append(conCurves, con), append(sizeCurves, size)
	}
	tables := []table{
		curveTable("Scaling: publish throughput against concurrency (msgs/s)", fmt.Sprintf("k goroutines each calling Publish with one 256 B message, %d messages per point. Plot: docs/bench/publish-concurrency.png.", n), "goroutines", pubCurves),
		curveTable("Scaling: consume throughput against Worker concurrency (msgs/s)", fmt.Sprintf("A Worker of Concurrency k (default Prefetch, no-op handler) drains %d waiting 256 B messages. Plot: docs/bench/consume-concurrency.png.", n), "Concurrency", conCurves),
		curveTable("Scaling: publish + consume throughput against message size (msgs/s)", "sdk.NewAsyncPublisher (the broker's native PublishAsync, else the batching pool) publishing while a Worker of Concurrency 8 consumes; 256 KiB is 255 KiB so that headers fit the 256 KiB limits. Plot: docs/bench/size.png.", "bytes", sizeCurves),
		{title: "Latency publish → handler at a fixed rate", intro: fmt.Sprintf("%d msgs/s for %s, one Publish per message, a Worker of Concurrency 8; the handler takes now − the publish time carried in the body. Plot: docs/bench/latency.png.", rate, latFor), head: []string{"broker", "p50", "p99"}, rows: latRows},
	}
	if plotDir != "" {
		if err := linePlot("Publish, k goroutines × 1 message", "goroutines", "msgs/s", pubCurves, true, filepath.Join(plotDir, "publish-concurrency.png")); err != nil {
			return nil, err
		}
		if err := linePlot("Consume, Worker Concurrency k", "Concurrency", "msgs/s", conCurves, true, filepath.Join(plotDir, "consume-concurrency.png")); err != nil {
			return nil, err
		}
		if err := linePlot("Publish + consume against message size", "bytes", "msgs/s", sizeCurves, true, filepath.Join(plotDir, "size.png")); err != nil {
			return nil, err
		}
		names := make([]string, len(lats))
		p50s, p99s := make(plotter.Values, len(lats)), make(plotter.Values, len(lats))
		for i, l := range lats {
			names[i], p50s[i], p99s[i] = l.name, float64(l.p50.Microseconds())/1000, float64(l.p99.Microseconds())/1000
		}
		if err := barPlot(fmt.Sprintf("Latency publish → handler at %d msgs/s", rate), names, p50s, p99s, filepath.Join(plotDir, "latency.png")); err != nil {
			return nil, err
		}
	}
	return tables, nil
}

func curveTable(title, intro, x string, cs []curve) table {
	t := table{title: title, intro: intro, head: []string{"broker"}}
	if len(cs) == 0 {
		return t
	}
	for _, v := range cs[0].xs {
		label := fmt.Sprint(v)
		if x == "bytes" {
			label = sizeLabel(int(v))
		}
		t.head = append(t.head, label)
	}
	for _, c := range cs {
		row := []string{c.name}
		for _, y := range c.ys {
			row = append(row, rateStr(y))
		}
		t.rows = append(t.rows, row)
	}
	return t
}

func sizeLabel(b int) string {
	switch {
	case b >= 250<<10:
		return "256 KiB"
	case b >= 1<<10:
		return fmt.Sprintf("%d KiB", b>>10)
	default:
		return fmt.Sprintf("%d B", b)
	}
}

// consume runs a Worker of concurrency k on q until n messages are acked;
// handle, when set, runs in the handler.
func consume(ctx context.Context, b sdk.Broker, q string, k, n int, handle func(sdk.Delivery)) (time.Duration, error) {
	cnt := &counter{}
	done := cnt.expect(int64(n))
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		if handle != nil {
			handle(d)
		}
		return nil
	}), sdk.WorkerOptions{Queue: q, Concurrency: k, Observers: []sdk.Observer{ackObserver{cnt}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- w.Run(wctx) }()
	select {
	case <-done:
	case err := <-errc:
		stop()
		return 0, fmt.Errorf("worker stopped: %v", err)
	case <-time.After(5 * time.Minute):
		stop()
		<-errc
		return 0, fmt.Errorf("%d of %d messages in 5 minutes", cnt.n.Load(), n)
	}
	d := time.Since(start)
	stop()
	return d, <-errc
}

// endToEnd publishes m messages of size bytes through the async publisher
// while a Worker of Concurrency 8 consumes them.
func endToEnd(ctx context.Context, b sdk.Broker, q string, size, m int) (time.Duration, error) {
	ap := sdk.NewAsyncPublisher(b, sdk.AsyncOptions{})
	defer ap.Close()
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		body := make([]byte, size)
		results := make([]*sdk.PublishResult, 0, m)
		for range m {
			r, err := ap.PublishAsync(ctx, q, &sdk.Message{Type: "bench", Body: body})
			if err != nil {
				errc <- err
				return
			}
			results = append(results, r)
		}
		for _, r := range results {
			if err := r.Wait(ctx); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	if _, err := consume(ctx, b, q, 8, m, nil); err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, <-errc
}

// latency publishes at rate msgs/s for dur and returns the p50 and p99 of
// publish → handler.
func latency(ctx context.Context, b sdk.Broker, q string, rate int, dur time.Duration) (time.Duration, time.Duration, error) {
	n := int(float64(rate) * dur.Seconds())
	var mu sync.Mutex
	ds := make([]time.Duration, 0, n)
	errc := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for range n {
			<-tick.C
			body := make([]byte, bodySize)
			binary.BigEndian.PutUint64(body, uint64(time.Now().UnixNano()))
			if err := b.Publish(ctx, q, &sdk.Message{Type: "bench", Body: body}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	_, err := consume(ctx, b, q, 8, n, func(d sdk.Delivery) {
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(d.Message().Body)))
		mu.Lock()
		ds = append(ds, time.Since(sent))
		mu.Unlock()
	})
	if err != nil {
		return 0, 0, err
	}
	if err := <-errc; err != nil {
		return 0, 0, err
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], ds[len(ds)*99/100], nil
}

func linePlot(title, x, y string, cs []curve, logX bool, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	if logX {
		p.X.Scale = plot.LogScale{}
		if len(cs) > 0 {
			var ticks []plot.Tick
			for _, v := range cs[0].xs {
				label := fmt.Sprint(v)
				if x == "bytes" {
					label = sizeLabel(int(v))
				}
				ticks = append(ticks, plot.Tick{Value: v, Label: label})
			}
			p.X.Tick.Marker = plot.ConstantTicks(ticks)
		}
	}
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{}
	p.Legend.Top = true
	for i, c := range cs {
		pts := make(plotter.XYs, len(c.xs))
		for j := range c.xs {
			pts[j].X, pts[j].Y = c.xs[j], c.ys[j]
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		col := plotutil.Color(i)
		l.Color, s.Color = col, col
		s.Shape = plotutil.Shape(i)
		p.Add(l, s)
		p.Legend.Add(c.name, l, s)
	}
	p.Add(plotter.NewGrid())
	// Head room above the highest point for the legend.
	top := 0.0
	for _, c := range cs {
		for _, y := range c.ys {
			top = max(top, y)
		}
	}
	p.Y.Max = top * 30
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func barPlot(title string, names []string, p50, p99 plotter.Values, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "ms"
	w := vg.Points(18)
	b50, err := plotter.NewBarChart(p50, w)
	if err != nil {
		return err
	}
	b99, err := plotter.NewBarChart(p99, w)
	if err != nil {
		return err
	}
	b50.Color, b99.Color = color.RGBA{R: 70, G: 130, B: 180, A: 255}, color.RGBA{R: 220, G: 90, B: 60, A: 255}
	b50.Offset, b99.Offset = -w/2, w/2
	p.Add(b50, b99)
	p.Legend.Add("p50", b50)
	p.Legend.Add("p99", b99)
	p.Legend.Top = true
	p.NominalX(names...)
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
