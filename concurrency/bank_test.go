package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
)

type transfer struct {
	ID     int64 `json:"id"`
	From   int64 `json:"from"`
	To     int64 `json:"to"`
	Amount int64 `json:"amount"`
}

// bankObserver counts settlements and sends on done when want acks arrived.
type bankObserver struct {
	want               int64
	acks, retries, dlq atomic.Int64
	released           atomic.Int64
	done               chan struct{}
	once               sync.Once
}

func (o *bankObserver) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (o *bankObserver) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	switch s.Action {
	case sdk.ActionAck:
		if o.acks.Add(1) == o.want {
			o.once.Do(func() { close(o.done) })
		}
	case sdk.ActionRetry:
		o.retries.Add(1)
	case sdk.ActionRelease:
		o.released.Add(1)
	case sdk.ActionDeadLetter:
		o.dlq.Add(1)
		o.once.Do(func() { close(o.done) })
	}
}

var errInjected = errors.New("injected transient failure")

// TestBankTransfers: 50 accounts, 5,000 transfers published with 10%
// duplicates, consumed from the memory broker by an sdk.Worker running 8
// handlers at once. Odd transfers lock both rows (rowlock), even ones use
// optimistic versions with reload-and-retry; both touch the rows in id order
// and bump the version, so they mix safely. A transfer's first attempt
// sometimes fails before commit (rolled back, retried) and sometimes after
// commit but before the ack (the redelivery must not apply it again). A
// unique transfer-id row makes each transfer apply once. The total balance,
// sampled all along, never changes; at the end each account holds exactly
// its starting balance plus its ledger.
func TestBankTransfers(t *testing.T) {
	const accounts, transfers, start, workers = 50, 5000, 10_000, 8
	pool, _ := pgtest.Schema(t, workers+2)
	pgtest.Exec(t, pool,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		fmt.Sprintf(`INSERT INTO accounts (id, balance) SELECT g, %d FROM generate_series(1, %d) g`, start, accounts),
		`CREATE TABLE transfers (id bigint PRIMARY KEY, from_id bigint NOT NULL, to_id bigint NOT NULL, amount bigint NOT NULL)`)
	ctx := context.Background()

	rows, err := rowlock.New(rowlock.Options{Table: "accounts", Columns: []string{"balance"}, Timeout: 2 * time.Second, RetryDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	versioned, err := optimistic.New(optimistic.Options{Table: "accounts"})
	if err != nil {
		t.Fatal(err)
	}
	retrier := &optimistic.Retrier{MaxAttempts: 20}

	// record inserts the transfer's unique row; false means it was applied
	// already (a duplicate delivery or a redelivery after commit).
	record := func(ctx context.Context, tx pgx.Tx, tr transfer) (bool, error) {
		tag, err := tx.Exec(ctx, `INSERT INTO transfers VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`, tr.ID, tr.From, tr.To, tr.Amount)
		return tag.RowsAffected() == 1, err
	}
	// delta lists the two rows in id order with their balance changes.
	delta := func(tr transfer) [2]struct{ id, d int64 } {
		a := [2]struct{ id, d int64 }{{tr.From, -tr.Amount}, {tr.To, tr.Amount}}
		if a[0].id > a[1].id {
			a[0], a[1] = a[1], a[0]
		}
		return a
	}
	withRowLock := func(ctx context.Context, tx pgx.Tx, tr transfer) error {
		for _, r := range delta(tr) {
			var bal int64
			if _, err := rows.Lock(ctx, tx, r.id, &bal); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = $2, version = version + 1 WHERE id = $1`, r.id, bal+r.d); err != nil {
				return err
			}
		}
		return nil
	}
	withVersions := func(ctx context.Context, tx pgx.Tx, tr transfer) error {
		for _, r := range delta(tr) {
			var bal int64
			v, err := versioned.Get(ctx, tx, r.id, []string{"balance"}, &bal)
			if err != nil {
				return err
			}
			if _, err := versioned.Update(ctx, tx, r.id, v, map[string]any{"balance": bal + r.d}); err != nil {
				return err
			}
		}
		return nil
	}
	handler := sdk.JSON(func(ctx context.Context, d sdk.Delivery, tr transfer) error {
		apply := withRowLock
		if tr.ID%2 == 0 {
			apply = withVersions
		}
		failBefore := d.Attempt() == 1 && tr.ID%25 == 0
		failAfter := d.Attempt() == 1 && tr.ID%40 == 0
		err := retrier.Do(ctx, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				fresh, err := record(ctx, tx, tr)
				if err != nil || !fresh {
					return err
				}
				if err := apply(ctx, tx, tr); err != nil {
					return err
				}
				if failBefore {
					return errInjected // rolled back
				}
				return nil
			})
		})
		if err == nil && failAfter {
			return errInjected // committed, not acked: redelivered
		}
		return err
	})

	// The workload: each transfer once, 10% twice, shuffled.
	rng := rand.New(rand.NewPCG(7, 7))
	var msgs []*sdk.Message
	want := make(map[int64]int64, accounts)
	injected := 0
	for id := int64(1); id <= transfers; id++ {
		from := 1 + rng.Int64N(accounts)
		to := 1 + rng.Int64N(accounts-1)
		if to >= from {
			to++
		}
		tr := transfer{ID: id, From: from, To: to, Amount: 1 + rng.Int64N(100)}
		want[from] -= tr.Amount
		want[to] += tr.Amount
		if id%25 == 0 || id%40 == 0 {
			injected++
		}
		copies := 1
		if rng.IntN(10) == 0 {
			copies = 2
		}
		for range copies {
			m, err := sdk.NewJSON("bank.transfer", tr)
			if err != nil {
				t.Fatal(err)
			}
			m.IdempotencyKey = "transfer:" + strconv.FormatInt(id, 10)
			msgs = append(msgs, m)
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })

	broker, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	queue := "bank-" + testenv.Suffix()
	if err := broker.Publish(ctx, queue, msgs...); err != nil {
		t.Fatal(err)
	}
	obs := &bankObserver{want: int64(len(msgs)), done: make(chan struct{})}
	w, err := sdk.NewWorker(broker, handler, sdk.WorkerOptions{
		Queue: queue, Concurrency: workers,
		Retry:     sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: time.Millisecond, Max: 20 * time.Millisecond}},
		Observers: []sdk.Observer{obs},
		Rand:      rand.New(rand.NewPCG(1, 1)),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}

	// Sample the total while transfers run: one statement, one snapshot.
	total := int64(accounts * start)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var samples atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for sampleCtx.Err() == nil {
			var sum int64
			if err := pool.QueryRow(sampleCtx, "SELECT sum(balance) FROM accounts").Scan(&sum); err != nil {
				if sampleCtx.Err() == nil {
					t.Errorf("sample: %v", err)
				}
				return
			}
			samples.Add(1)
			if sum != total {
				t.Errorf("total balance %d while transfers run, want %d", sum, total)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(runCtx) }()
	<-obs.done
	stop()
	if err := <-runErr; err != nil {
		t.Errorf("worker: %v", err)
	}
	stopSampling()
	sampler.Wait()

	if n := obs.dlq.Load(); n != 0 {
		dead, _ := broker.ListDeadLetters(ctx, queue, 5)
		for _, m := range dead {
			t.Logf("dead letter: %s", m.Header(sdk.HeaderDeadLetterReason))
		}
		t.Fatalf("%d transfers dead-lettered", n)
	}
	var applied int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM transfers").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != transfers {
		t.Errorf("%d transfers recorded, want %d", applied, transfers)
	}
	var sum int64
	if err := pool.QueryRow(ctx, "SELECT sum(balance) FROM accounts").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != total {
		t.Errorf("final total %d, want %d", sum, total)
	}
	got, err := pool.Query(ctx, "SELECT id, balance FROM accounts")
	if err != nil {
		t.Fatal(err)
	}
	for got.Next() {
		var id, bal int64
		if err := got.Scan(&id, &bal); err != nil {
			t.Fatal(err)
		}
		if bal != start+want[id] {
			t.Errorf("account %d holds %d, want %d: a transfer applied twice or not at all", id, bal, start+want[id])
		}
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
	if r := obs.retries.Load(); r < int64(injected) {
		t.Errorf("%d retries, want at least the %d injected failures", r, injected)
	}
	t.Logf("%d deliveries (%d duplicates) acked; %d retries (%d injected), %d busy releases, %d version conflicts re-applied, %d total-balance samples",
		len(msgs), len(msgs)-transfers, obs.retries.Load(), injected, obs.released.Load(), retrier.Conflicts(), samples.Load())
}
