package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

func postgresDSN() string {
	if u := os.Getenv("BERTH_POSTGRES_DSN"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// benchArgs is River's job: the same 256-byte body berth carries.
type benchArgs struct {
	Body []byte `json:"body"`
}

func (benchArgs) Kind() string { return "bench" }

type riverWorker struct {
	river.WorkerDefaults[benchArgs]
	cnt *counter
}

func (w *riverWorker) Work(context.Context, *river.Job[benchArgs]) error {
	w.cnt.add()
	return nil
}

const (
	pgConcurrency = 8
	pgPoolSize    = pgConcurrency + 2
)

// stmtCounter counts the statements and round trips this process sends
// (pgx tracer): an autocommitted statement or a pipelined batch is one round
// trip and, outside an explicit transaction, one commit.
type stmtCounter struct {
	queries, trips atomic.Int64
}

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.queries.Add(1)
	s.trips.Add(1)
	return ctx
}
func (s *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.trips.Add(1)
	return ctx
}
func (s *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.queries.Add(1)
}
func (s *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// counted wraps v's rounds to report, on stderr, the statements and round
// trips per message its rounds sent (other variants are idle meanwhile,
// apart from their pollers).
func counted(v variant, sc *stmtCounter) variant {
	round := v.round
	var msgs, queries, trips int64
	v.round = func(ctx context.Context, n int) (time.Duration, error) {
		q0, t0 := sc.queries.Load(), sc.trips.Load()
		d, err := round(ctx, n)
		msgs += int64(n)
		queries += sc.queries.Load() - q0
		trips += sc.trips.Load() - t0
		fmt.Fprintf(os.Stderr, "berthbench: postgres: %s: %.3f statements, %.3f round trips a message (%d messages so far)\n",
			v.name, float64(queries)/float64(msgs), float64(trips)/float64(msgs), msgs)
		return d, err
	}
	return v
}

func runPostgres(ctx context.Context, c config) ([]table, error) {
	pcfg, err := pgxpool.ParseConfig(postgresDSN())
	if err != nil {
		return nil, err
	}
	sc := &stmtCounter{}
	if os.Getenv("BERTH_BENCH_PGSTATS") != "" {
		pcfg.ConnConfig.Tracer = sc
	}
	// Each variant has a pool of its own, of pgPoolSize connections (enough
	// for the raw loop's 8 claimers and its producer at once), so that none
	// waits for a connection another variant's idle poller holds.
	pcfg.MaxConns = pgPoolSize
	newPool := func() (*pgxpool.Pool, error) { return pgxpool.NewWithConfig(ctx, pcfg.Copy()) }
	pool, err := newPool()
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	berthSchema, riverSchema, rawSchema := "berthbench_b"+suffix, "berthbench_r"+suffix, "berthbench_x"+suffix
	defer func() {
		for _, s := range []string{berthSchema, berthSchema + "f", riverSchema, rawSchema} {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	}()
	body := make([]byte, bodySize)

	wctx, stop := context.WithCancel(ctx)
	var owned sync.WaitGroup
	var closers []func()
	defer func() {
		stop()
		owned.Wait()
		for _, c := range closers {
			c()
		}
	}()
	// berth: the PostgreSQL broker and a Worker, running throughout; once
	// with the defaults, once tuned like River's fast fetch.
	berthVariant := func(name, schema, cfg string, o postgres.Options, prefetch int) (variant, error) {
		o.Schema = schema
		o.Logger = slog.New(slog.DiscardHandler)
		bpool, err := newPool()
		if err != nil {
			return variant{}, err
		}
		br, err := postgres.New(bpool, o)
		if err != nil {
			bpool.Close()
			return variant{}, err
		}
		closers = append(closers, func() { _ = br.Close() }, bpool.Close) // in this order
		if err := br.Migrate(ctx); err != nil {
			return variant{}, err
		}
		if err := br.DeclareQueue(ctx, "bench"); err != nil {
			return variant{}, err
		}
		cnt := &counter{}
		w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{
			Queue: "bench", Concurrency: pgConcurrency, Prefetch: prefetch, Observers: []sdk.Observer{ackObserver{cnt}}, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return variant{}, err
		}
		owned.Go(func() { _ = w.Run(wctx) })
		return variant{name: name, config: cfg, round: func(ctx context.Context, n int) (time.Duration, error) {
			return timed(func() error {
				done := cnt.expect(int64(n))
				for sent := 0; sent < n; {
					batch := make([]*sdk.Message, min(100, n-sent))
					for i := range batch {
						batch[i] = &sdk.Message{Type: "bench", Body: body}
					}
					if err := br.Publish(ctx, "bench", batch...); err != nil {
						return err
					}
					sent += len(batch)
				}
				<-done
				return nil
			})
		}}, nil
	}
	berth, err := berthVariant("berth Worker, PostgreSQL broker, defaults", berthSchema, "Concurrency 8, default Prefetch and PollInterval, LISTEN/NOTIFY; producer: Publish of 100", postgres.Options{}, 0)
	if err != nil {
		return nil, err
	}
	berthFast, err := berthVariant("berth Worker, PostgreSQL broker, tuned", berthSchema+"f", "Concurrency 8, Prefetch 192 (holds up to 200: a claim of 100, like the raw loop's, while the previous 100 are acked; the raw loop's 8 claimers hold up to 800), PollInterval 20 ms, LISTEN/NOTIFY; producer: Publish of 100", postgres.Options{PollInterval: 20 * time.Millisecond}, 192)
	if err != nil {
		return nil, err
	}

	// River, with fast fetch: its client running throughout.
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{riverSchema}.Sanitize()); err != nil {
		return nil, err
	}
	rpool, err := newPool()
	if err != nil {
		return nil, err
	}
	defer rpool.Close()
	driver := riverpgxv5.New(rpool)
	mig, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: riverSchema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, err
	}
	rcnt := &counter{}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{cnt: rcnt})
	rc, err := river.NewClient(driver, &river.Config{
		Schema:            riverSchema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: pgConcurrency}},
		Workers:           workers,
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	if err := rc.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rc.Stop(sctx)
	}()
	rv := variant{name: "River", config: "MaxWorkers 8, FetchCooldown 1 ms, FetchPollInterval 20 ms (fast fetch); producer: InsertMany of 100", round: func(ctx context.Context, n int) (time.Duration, error) {
		return timed(func() error {
			done := rcnt.expect(int64(n))
			for sent := 0; sent < n; {
				batch := make([]river.InsertManyParams, min(100, n-sent))
				for i := range batch {
					batch[i] = river.InsertManyParams{Args: benchArgs{Body: body}}
				}
				if _, err := rc.InsertMany(ctx, batch); err != nil {
					return err
				}
				sent += len(batch)
			}
			<-done
			return nil
		})
	}}

	// raw: a careful SKIP LOCKED loop, batched claims and deletes.
	xpool, err := newPool()
	if err != nil {
		return nil, err
	}
	defer xpool.Close()
	raw, err := rawPostgres(ctx, xpool, rawSchema, body)
	if err != nil {
		return nil, err
	}
	n := msgs(c, 5000)
	vs := []variant{raw, berth, berthFast, rv}
	if pcfg.ConnConfig.Tracer != nil {
		for i := range vs {
			vs[i] = counted(vs[i], sc)
		}
	}
	var autovacuum string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&autovacuum); err != nil {
		return nil, err
	}
	vacuumNote := ""
	if autovacuum != "on" {
		// Every round updates or deletes thousands of rows. Without
		// autovacuum their dead versions pile up round after round in the
		// tables and claim indexes every variant scans, so later rounds
		// measure the bloat, not the queue (a berth Worker with the default
		// Prefetch, which claims 8–16 rows at a time, went from 2 s to 15 s
		// a round). Vacuum each variant's schema before its round, untimed,
		// as autovacuum would on a production server.
		for i, s := range []string{rawSchema, berthSchema, berthSchema + "f", riverSchema} {
			vs[i] = vacuumed(vs[i], pool, s)
		}
		vacuumNote = " This server runs with autovacuum off, so each variant's tables are vacuumed before its round (untimed)."
	}
	res, err := alternate(ctx, vs, c.rounds, n)
	if err != nil {
		return nil, err
	}
	rs := rows(res, 0)
	rs = append(rs, []string{"berth ÷ River (defaults · tuned)", "", "", fmt.Sprintf("**%.2f · %.2f**", res[1].rate()/res[3].rate(), res[2].rate()/res[3].rate()), ""})
	return []table{{
		title: "PostgreSQL — berth Worker vs River vs a raw SKIP LOCKED loop (publish + consume, 256 B)",
		intro: fmt.Sprintf("End to end: each round inserts %d jobs in batches of 100 while the consumers, running throughout, work them; the round ends when the last is done. Each variant has its own pool of %d connections.%s × is against the raw loop.", n, pgPoolSize, vacuumNote),
		head:  resultHead,
		rows:  rs,
	}}, nil
}

// vacuumed runs VACUUM on every table of schema before each of v's rounds,
// outside the round's timing.
func vacuumed(v variant, pool *pgxpool.Pool, schema string) variant {
	round := v.round
	v.round = func(ctx context.Context, n int) (time.Duration, error) {
		rows, err := pool.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
		if err != nil {
			return 0, err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, err
		}
		for _, t := range tables {
			if _, err := pool.Exec(ctx, "VACUUM "+pgx.Identifier{schema, t}.Sanitize()); err != nil {
				return 0, fmt.Errorf("vacuum %s.%s: %w", schema, t, err)
			}
		}
		return round(ctx, n)
	}
	return v
}

// rawPostgres is the raw baseline: a jobs table with a lease column, 8
// goroutines each claiming up to 100 due rows (UPDATE … FOR UPDATE SKIP
// LOCKED … RETURNING), handling them (no-op) and deleting them in one
// statement; producers insert 100 rows per INSERT … SELECT unnest.
func rawPostgres(ctx context.Context, pool *pgxpool.Pool, schema string, body []byte) (variant, error) {
	t := pgx.Identifier{schema, "jobs"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+"; CREATE TABLE "+t+
		" (id bigserial PRIMARY KEY, body bytea NOT NULL, visible_at timestamptz NOT NULL DEFAULT now()); CREATE INDEX ON "+t+" (visible_at)"); err != nil {
		return variant{}, err
	}
	// The locking subquery is a CTE, which PostgreSQL runs once: written as
	// "WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)" the planner may put it
	// on the inner side of a join and run it again for every row, locking
	// rows the claim does not return. With fresh statistics (after a
	// VACUUM) it did, and the 8 claimers deadlocked.
	claim := "WITH c AS MATERIALIZED (SELECT id FROM " + t + " WHERE visible_at <= now() ORDER BY visible_at LIMIT 100 FOR UPDATE SKIP LOCKED) " +
		"UPDATE " + t + " AS j SET visible_at = now() + interval '30 seconds' FROM c WHERE j.id = c.id RETURNING j.id, j.body"
	return variant{name: "raw pgx SKIP LOCKED loop", config: "8 goroutines: claim up to 100 with a 30 s lease, no-op, DELETE … WHERE id = ANY(batch); producer: INSERT of 100 (unnest)", round: func(ctx context.Context, n int) (time.Duration, error) {
		return timed(func() error {
			var mu sync.Mutex
			left := n
			errc := make(chan error, pgConcurrency+1)
			var wg sync.WaitGroup
			wg.Go(func() {
				for sent := 0; sent < n; {
					k := min(100, n-sent)
					bodies := make([][]byte, k)
					for i := range bodies {
						bodies[i] = body
					}
					if _, err := pool.Exec(ctx, "INSERT INTO "+t+" (body) SELECT unnest($1::bytea[])", bodies); err != nil {
						errc <- err
						return
					}
					sent += k
				}
			})
			for range pgConcurrency {
				wg.Go(func() {
					for {
						mu.Lock()
						rest := left
						mu.Unlock()
						if rest <= 0 {
							return
						}
						rows, err := pool.Query(ctx, claim)
						if err != nil {
							errc <- err
							return
						}
						var ids []int64
						for rows.Next() {
							var id int64
							var b []byte
							if err := rows.Scan(&id, &b); err != nil {
								rows.Close()
								errc <- err
								return
							}
							ids = append(ids, id)
						}
						rows.Close()
						if err := rows.Err(); err != nil {
							errc <- err
							return
						}
						if len(ids) == 0 {
							time.Sleep(time.Millisecond) // nothing due yet: the producer is behind
							continue
						}
						if _, err := pool.Exec(ctx, "DELETE FROM "+t+" WHERE id = ANY($1)", ids); err != nil {
							errc <- err
							return
						}
						mu.Lock()
						left -= len(ids)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			select {
			case err := <-errc:
				return err
			default:
				return nil
			}
		})
	}}, nil
}
