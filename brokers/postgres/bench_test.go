package postgres_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// BenchmarkBerthVsRaw runs the same work on the same kind of jobs table
// (fresh schema each round, same indexes, same pool), b.N jobs per side and
// round, with 4 workers and a batch of 10:
//
//   - raw: a hand-written pgx loop per worker: claim up to 10 rows with FOR
//     UPDATE SKIP LOCKED, complete them with one UPDATE ... WHERE id = ANY;
//   - broker: the same loop on berth's broker API: Receive(10), then Ack each
//     delivery (concurrently, so the broker's acker writes them together);
//   - broker-unbatched: the same, with one UPDATE per Ack (is the acker needed?);
//   - worker: 4 sdk.Workers holding at most 10 jobs each (Concurrency 5,
//     Prefetch 5), a no-op handler;
//   - worker-prefetch: 4 sdk.Workers with Concurrency 10 and the default
//     Prefetch (10): they may claim up to 20 at a time.
//
// It reports jobs/s per side, each side's ratio to raw, and the average claim
// size and ack batch berth saw. Run it with a fixed count, e.g.
// -benchtime=3000x.
func BenchmarkBerthVsRaw(b *testing.B) {
	const workers, batch = 4, 10
	pool := newPool(b, "berth-bench", workers+2)
	type side struct {
		name string
		run  func(br *postgres.Broker, q string, claims *claimCounter)
	}
	sides := []side{
		{"raw", func(br *postgres.Broker, q string, _ *claimCounter) { rawLoop(b, pool, br.Schema(), q, workers, batch) }},
		{"broker", func(br *postgres.Broker, q string, c *claimCounter) { brokerLoop(b, br, c, q, b.N, workers, batch) }},
		{"broker-unbatched", func(br *postgres.Broker, q string, c *claimCounter) {
			br.SetUnbatchedAcks(true) // one UPDATE per ack: is the acker needed?
			brokerLoop(b, br, c, q, b.N, workers, batch)
		}},
		{"worker", func(br *postgres.Broker, q string, c *claimCounter) {
			berthWorkers(b, c, q, b.N, workers, batch/2, batch-batch/2) // holds at most batch, like raw
		}},
		{"worker-prefetch", func(br *postgres.Broker, q string, c *claimCounter) {
			berthWorkers(b, c, q, b.N, workers, batch, batch) // the Worker's default Prefetch: holds up to 2·batch
		}},
	}
	took := map[string]time.Duration{}
	cpu := map[string]time.Duration{} // this process's CPU (the client side; the server's is not counted)
	claims := map[string]*claimCounter{}
	acks := map[string][2]int64{}
	// Many short interleaved rounds, each side's order rotating, so that the
	// load of a shared machine falls on every side alike.
	const rounds = 6
	for round := range rounds {
		for i := range sides {
			s := sides[(i+round)%len(sides)]
			br := newBroker(b, pool, postgres.Options{Lease: time.Minute, PollInterval: 100 * time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
			q := "bench_" + suffix()
			publishBench(b, br, q, b.N)
			if claims[s.name] == nil {
				claims[s.name] = &claimCounter{Subscriber: br}
			}
			claims[s.name].Subscriber = br
			start, cpu0 := time.Now(), processCPU()
			s.run(br, q, claims[s.name])
			took[s.name] += time.Since(start)
			cpu[s.name] += processCPU() - cpu0
			var done int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+br.Schema()+`.jobs
				WHERE queue = $1 AND status = 'completed'`, q).Scan(&done); err != nil || done != b.N {
				b.Fatalf("%s: %d of %d jobs completed (%v)", s.name, done, b.N, err)
			}
			f, a := br.AckStats()
			acks[s.name] = [2]int64{acks[s.name][0] + f, acks[s.name][1] + a}
			_ = br.Close()
		}
	}
	rate := func(side string) float64 { return float64(rounds*b.N) / took[side].Seconds() }
	b.ReportMetric(0, "ns/op")
	for _, s := range sides {
		b.ReportMetric(rate(s.name), s.name+"-jobs/s")
		b.ReportMetric(float64(cpu[s.name].Microseconds())/float64(rounds*b.N), s.name+"-client-cpu-µs/job")
		if s.name == "raw" {
			continue
		}
		b.ReportMetric(rate(s.name)/rate("raw"), s.name+"/raw")
		b.ReportMetric(claims[s.name].avg(), s.name+"-claim-size")
		b.ReportMetric(float64(acks[s.name][1])/float64(acks[s.name][0]), s.name+"-ack-batch")
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// claimCounter counts the deliveries per Receive call.
type claimCounter struct {
	sdk.Subscriber
	calls, got atomic.Int64
}

func (c *claimCounter) Receive(ctx context.Context, q string, n int) ([]sdk.Delivery, error) {
	ds, err := c.Subscriber.Receive(ctx, q, n)
	c.calls.Add(1)
	c.got.Add(int64(len(ds)))
	return ds, err
}

func (c *claimCounter) avg() float64 { return float64(c.got.Load()) / float64(max(c.calls.Load(), 1)) }

func publishBench(b *testing.B, br *postgres.Broker, q string, n int) {
	b.Helper()
	for n > 0 {
		k := min(n, 1000)
		msgs := make([]*sdk.Message, k)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: "bench", Body: []byte(`{"order":"order_123","amount":4200}`)}
		}
		if err := br.Publish(context.Background(), q, msgs...); err != nil {
			b.Fatalf("Publish: %v", err)
		}
		n -= k
	}
}

// rawLoop is what a team would write by hand: workers goroutines, each
// claiming batch rows with SKIP LOCKED and completing them in one statement,
// until the queue is empty.
func rawLoop(b *testing.B, pool *pgxpool.Pool, schema, q string, workers, batch int) {
	b.Helper()
	table := pgx.Identifier{schema, "jobs"}.Sanitize()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				rows, err := pool.Query(ctx, `WITH c AS (
						SELECT id FROM `+table+`
						WHERE queue = $1 AND status IN ('queued', 'retry', 'processing') AND available_at <= now()
						ORDER BY available_at LIMIT $2 FOR UPDATE SKIP LOCKED)
					UPDATE `+table+` j SET status = 'processing', attempt_count = j.attempt_count + 1,
						available_at = now() + interval '1 minute', visibility_until = now() + interval '1 minute',
						worker_id = 'raw', updated_at = now()
					FROM c WHERE j.id = c.id
					RETURNING j.id, j.payload`, q, batch)
				if err != nil {
					b.Error(err)
					return
				}
				var ids []int64
				for rows.Next() {
					var (
						id      int64
						payload []byte
					)
					if err := rows.Scan(&id, &payload); err != nil {
						b.Error(err)
					}
					ids = append(ids, id)
				}
				rows.Close()
				if rows.Err() != nil {
					b.Error(rows.Err())
					return
				}
				if len(ids) == 0 {
					return
				}
				if _, err := pool.Exec(ctx, `UPDATE `+table+` SET status = 'completed', updated_at = now()
					WHERE id = ANY($1)`, ids); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// berthWorkers runs workers sdk.Workers on sub, each with the given
// Concurrency and Prefetch (a Receive asks for at most their sum), until n
// jobs are acked.
func berthWorkers(b *testing.B, sub sdk.Subscriber, q string, n, workers, concurrency, prefetch int) {
	b.Helper()
	var acked atomic.Int64
	done := make(chan struct{})
	obs := ackCounter{n: int64(n), acked: &acked, done: done}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range workers {
		w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
			sdk.WorkerOptions{Queue: q, Concurrency: concurrency, Prefetch: prefetch, Lease: time.Minute, HeartbeatInterval: -1,
				Observers: []sdk.Observer{obs}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				b.Error(err)
			}
		})
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Error("berth workers did not finish")
	}
	cancel()
	wg.Wait()
}

type ackCounter struct {
	n     int64
	acked *atomic.Int64
	done  chan struct{}
}

func (a ackCounter) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (a ackCounter) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action == sdk.ActionAck && s.Err == nil && a.acked.Add(1) == a.n {
		close(a.done)
	}
}

// brokerLoop is rawLoop's loop on berth's broker API: workers goroutines,
// each receiving up to batch deliveries and acking them (the acks of one
// batch run concurrently, as a Worker's handlers would, so the broker's acker
// writes them together), until n jobs are acked.
func brokerLoop(b *testing.B, br *postgres.Broker, c *claimCounter, q string, n, workers, batch int) {
	b.Helper()
	var acked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for acked.Load() < int64(n) {
				ds, err := c.Receive(ctx, q, batch)
				if err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				var acks sync.WaitGroup
				for _, d := range ds {
					acks.Go(func() {
						if err := d.Ack(ctx); err != nil {
							b.Error(err)
						}
					})
				}
				acks.Wait()
				if acked.Add(int64(len(ds))) >= int64(n) {
					cancel()
				}
			}
		})
	}
	wg.Wait()
}
