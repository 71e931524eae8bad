package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
)

// BenchmarkTransactional runs one handler — it updates one row of a
// 1,000-row table — side by side on PostgreSQL, interleaved in rounds so
// that the load of a shared machine weighs on every variant alike:
//
//   - plain: without idempotency (the UPDATE autocommits);
//   - plain-tx: without idempotency, in a transaction of its own
//     (BEGIN, UPDATE, COMMIT);
//   - transactional: under the transactional guard (BEGIN, INSERT of the
//     key row, UPDATE, COMMIT).
//
// Each reports jobs/s with 8 concurrent handlers, and the ratios of the
// guarded handler to each baseline.
func BenchmarkTransactional(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	accounts := pgx.Identifier{e.schema, "accounts"}.Sanitize()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+accounts+` (id integer PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, version integer NOT NULL DEFAULT 0);
INSERT INTO `+accounts+` (id) SELECT generate_series(1, 1000)`); err != nil {
		b.Fatal(err)
	}
	update := `UPDATE ` + accounts + ` SET balance = balance + 1, version = version + 1 WHERE id = $1`
	account := func(d sdk.Delivery) int { return int(d.Message().Body[0])<<8 | int(d.Message().Body[1]) }
	// The handler, written once: through the guard's transaction when there
	// is one, else straight on the pool.
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if tx, ok := pgstore.TxFrom(ctx); ok {
			_, err := tx.Exec(ctx, update, account(d))
			return err
		}
		_, err := e.pool.Exec(ctx, update, account(d))
		return err
	})
	ownTx := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, update, account(d))
			return err
		})
	})
	guard, err := idempotency.Middleware(idempotency.Options{Store: e.store})
	if err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name string
		h    sdk.Handler
	}{{"plain", handler}, {"plain-tx", ownTx}, {"transactional", guard(handler)}}

	const workers, round = 8, 200
	var seq atomic.Int64
	// runJobs handles n jobs with 8 goroutines and returns how long it took.
	runJobs := func(h sdk.Handler, n int) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					id := 1 + rand.IntN(1000)
					m := &sdk.Message{ID: sdk.NewID(), Type: "bench.update", IdempotencyKey: fmt.Sprintf("update:%d", seq.Add(1)), Body: []byte{byte(id >> 8), byte(id)}}
					if err := h.Handle(ctx, newDelivery(m)); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	elapsed := make([]time.Duration, len(variants))
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		for i, v := range variants {
			elapsed[i] += runJobs(v.h, n)
		}
	}
	b.StopTimer()
	rate := make([]float64, len(variants))
	for i, v := range variants {
		rate[i] = float64(b.N) / elapsed[i].Seconds()
		b.ReportMetric(rate[i], v.name+"-jobs/s")
	}
	b.ReportMetric(rate[2]/rate[0], "ratio-vs-plain")
	b.ReportMetric(rate[2]/rate[1], "ratio-vs-plain-tx")
	b.ReportMetric(0, "ns/op")
}
