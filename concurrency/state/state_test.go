package state_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/state"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var orderFlow = map[string][]string{
	"pending":    {"processing", "cancelled"},
	"processing": {"paid", "cancelled"},
	"paid":       {"refunded"},
	"refunded":   nil,
	"cancelled":  nil,
}

// rank orders the states along every path of orderFlow.
var rank = map[string]int{"pending": 0, "processing": 1, "paid": 2, "cancelled": 2, "refunded": 3}

func setup(t *testing.T, rows int) (*pgxpool.Pool, *state.Machine) {
	t.Helper()
	pool, _ := pgtest.Schema(t, 10)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, charged_at timestamptz)`,
		fmt.Sprintf(`INSERT INTO orders (id, status) SELECT g, 'pending' FROM generate_series(1, %d) g`, rows),
		// Every status change, as the database saw it.
		`CREATE TABLE history (seq bigserial PRIMARY KEY, id bigint, old text, new text)`,
		`CREATE FUNCTION log_status() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF NEW.status IS DISTINCT FROM OLD.status THEN
		     INSERT INTO history (id, old, new) VALUES (OLD.id, OLD.status, NEW.status);
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER log_status AFTER UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION log_status()`)
	m, err := state.New(state.Options{Table: "orders", Transitions: orderFlow})
	if err != nil {
		t.Fatal(err)
	}
	return pool, m
}

func TestNewValidatesTable(t *testing.T) {
	cases := map[string]map[string][]string{
		"empty":      {},
		"unknown":    {"a": {"b"}},
		"self-loop":  {"a": {"a"}},
		"cycle":      {"a": {"b"}, "b": {"c"}, "c": {"a"}},
		"duplicate":  {"a": {"b", "b"}, "b": nil},
		"empty name": {"": {"b"}, "b": nil},
	}
	for name, tr := range cases {
		if _, err := state.New(state.Options{Table: "orders", Transitions: tr}); !errors.Is(err, state.ErrInvalidTable) {
			t.Errorf("%s: New = %v, want ErrInvalidTable", name, err)
		}
	}
	for _, o := range []state.Options{
		{Table: "orders;", Transitions: orderFlow},
		{Table: "orders", StatusColumn: "status--", Transitions: orderFlow},
	} {
		if _, err := state.New(o); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("New(%q, %q) = %v, want ErrInvalid", o.Table, o.StatusColumn, err)
		}
	}
}

func TestTransition(t *testing.T) {
	pool, m := setup(t, 2)
	ctx := context.Background()
	res, err := m.Transition(ctx, pool, 1, "processing", nil)
	if err != nil || res != (state.Result{From: "pending", Changed: true}) {
		t.Fatalf("pending → processing = %+v, %v", res, err)
	}
	res, err = m.Transition(ctx, pool, 1, "paid", map[string]any{"charged_at": "2026-08-14T10:00:00Z"})
	if err != nil || res != (state.Result{From: "processing", Changed: true}) {
		t.Fatalf("processing → paid = %+v, %v", res, err)
	}
	// Re-applying the current state is a no-op success.
	res, err = m.Transition(ctx, pool, 1, "paid", nil)
	if err != nil || res != (state.Result{From: "paid", Changed: false}) {
		t.Fatalf("paid again = %+v, %v; want a no-op", res, err)
	}
	// Backward: permanent, typed, marked backward.
	_, err = m.Transition(ctx, pool, 1, "pending", nil)
	var te *state.TransitionError
	if !sdk.IsPermanent(err) || !errors.Is(err, state.ErrInvalidTransition) || !errors.As(err, &te) ||
		te.From != "paid" || te.To != "pending" || !te.Backward {
		t.Fatalf("paid → pending = %v, want permanent backward TransitionError", err)
	}
	// Skipping a required step: refused, not backward.
	_, err = m.Transition(ctx, pool, 2, "paid", nil)
	if !sdk.IsPermanent(err) || !errors.As(err, &te) || te.Backward || te.From != "pending" {
		t.Fatalf("pending → paid = %v, want permanent forward TransitionError", err)
	}
	if _, err := m.Transition(ctx, pool, 9, "paid", nil); !sdk.IsPermanent(err) || !errors.Is(err, state.ErrNotFound) {
		t.Errorf("missing row = %v, want permanent ErrNotFound", err)
	}
	if _, err := m.Transition(ctx, pool, 1, "shipped", nil); !sdk.IsPermanent(err) || !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("unknown state = %v, want permanent ErrUnknownState", err)
	}
	if _, err := m.Transition(ctx, pool, 2, "processing", map[string]any{"charged_at = now(), status": 1}); !errors.Is(err, sqlident.ErrInvalid) {
		t.Errorf("injected column = %v, want ErrInvalid", err)
	}
	var status string
	var charged bool
	if err := pool.QueryRow(ctx, "SELECT status, charged_at IS NOT NULL FROM orders WHERE id = 1").Scan(&status, &charged); err != nil {
		t.Fatal(err)
	}
	if status != "paid" || !charged {
		t.Errorf("row 1 = %s charged=%v, want paid and charged", status, charged)
	}
}

// TestStatusNeverMovesBackward: 8 workers apply, in a shuffled order and each
// up to three times, the transitions pending → processing → paid → refunded
// of 60 orders (a few are cancelled instead). A worker that meets a
// transition whose prerequisite has not happened yet puts it back on the
// queue, as a redelivery would. Every status change the database records
// moves forward along the table, each order's recorded history is one chain
// from pending, and every order ends in its final state. (An order whose
// "cancelled" arrives before its "processing" is cancelled from pending; the
// late "processing" is then refused as backward.)
func TestStatusNeverMovesBackward(t *testing.T) {
	const orders, workers = 60, 8
	pool, m := setup(t, orders)
	ctx := context.Background()
	type job struct {
		id int
		to string
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var jobs []job
	final := map[int]string{}
	for id := 1; id <= orders; id++ {
		path := []string{"processing", "paid", "refunded"}
		if id%10 == 0 {
			path = []string{"processing", "cancelled"}
		}
		final[id] = path[len(path)-1]
		for _, to := range path {
			for range 1 + rng.IntN(3) { // duplicate deliveries
				jobs = append(jobs, job{id, to})
			}
		}
		// Stale writers: a worker that read "pending" long ago tries to put it back.
		jobs = append(jobs, job{id, "pending"})
	}
	rng.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })

	queue := make(chan job, len(jobs)*4)
	for _, j := range jobs {
		queue <- j
	}
	var pending sync.WaitGroup
	pending.Add(len(jobs))
	var mu sync.Mutex
	var backward, notYet, noops int
	var wg sync.WaitGroup
	fail := make(chan error, workers)
	done := make(chan struct{})
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case j := <-queue:
					res, err := m.Transition(ctx, pool, j.id, j.to, nil)
					var te *state.TransitionError
					switch {
					case err == nil:
						if !res.Changed {
							mu.Lock()
							noops++
							mu.Unlock()
						}
					case errors.As(err, &te) && te.Backward:
						mu.Lock()
						backward++
						mu.Unlock()
					case errors.As(err, &te):
						// Prerequisite not applied yet: redeliver later.
						mu.Lock()
						notYet++
						mu.Unlock()
						queue <- j
						continue
					default:
						fail <- err
					}
					pending.Done()
				}
			}
		})
	}
	pending.Wait()
	close(done)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, "SELECT id, old, new FROM history ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]string{} // each order's history must chain from pending
	for rows.Next() {
		var id int
		var old, new string
		if err := rows.Scan(&id, &old, &new); err != nil {
			t.Fatal(err)
		}
		if rank[new] <= rank[old] || !m.Allowed(old, new) {
			t.Errorf("order %d moved %s → %s", id, old, new)
		}
		prev, ok := last[id]
		if !ok {
			prev = "pending"
		}
		if old != prev {
			t.Errorf("order %d: change from %s recorded after it reached %s", id, old, prev)
		}
		last[id] = new
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= orders; id++ {
		var status string
		if err := pool.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != final[id] || last[id] != final[id] {
			t.Errorf("order %d ends %s (history says %s), want %s", id, status, last[id], final[id])
		}
	}
	if backward == 0 || noops == 0 {
		t.Errorf("backward refusals %d, no-ops %d: the workload did not exercise them", backward, noops)
	}
	t.Logf("%d jobs: %d backward moves refused, %d no-op duplicates, %d early arrivals redelivered", len(jobs), backward, noops, notYet)
}

func ExampleNew() {
	_, err := state.New(state.Options{
		Table: "orders",
		Transitions: map[string][]string{
			"pending":    {"processing"},
			"processing": {"paid"},
			"paid":       {"pending"}, // a refund must not reopen the order
		},
	})
	fmt.Println(errors.Is(err, state.ErrInvalidTable))
	fmt.Println(err)
	// Output:
	// true
	// state: invalid transition table: cycle paid → pending → processing → paid
}

// interposer runs a real statement through db, and calls between after the
// first statement, to make another writer act at that exact point.
type interposer struct {
	state.DB
	calls   int
	between func()
}

func (i *interposer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	i.calls++
	if i.calls == 2 && i.between != nil {
		i.between()
	}
	return i.DB.QueryRow(ctx, sql, args...)
}

// The row moves into an allowed source state between Transition's refused
// UPDATE and the read that explains the refusal: Transition tries again and
// succeeds instead of reporting a refusal that is no longer true.
func TestTransitionRetriesWhenRowMovesIntoAllowedState(t *testing.T) {
	pool, m := setup(t, 1)
	ctx := context.Background()
	db := &interposer{DB: pool, between: func() {
		if _, err := m.Transition(ctx, pool, 1, "processing", nil); err != nil {
			t.Error(err)
		}
	}}
	res, err := m.Transition(ctx, db, 1, "paid", nil)
	if err != nil || res != (state.Result{From: "processing", Changed: true}) {
		t.Fatalf("Transition = %+v, %v; want processing → paid after the concurrent move", res, err)
	}
}

// TestNullStatusIsARefusedMove: a row whose status column is NULL (a
// nullable column added to an existing table) can take no transition — NULL
// is in no allowed-from set — so a move is refused permanently, as from an
// undeclared state. Before, reading the state to explain the refusal failed
// to scan NULL, and the job got a transient error and was retried for
// nothing until its attempts ran out.
func TestNullStatusIsARefusedMove(t *testing.T) {
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text)`,
		`INSERT INTO orders (id, status) VALUES (1, NULL)`)
	m, err := state.New(state.Options{Table: "orders", Transitions: orderFlow})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Transition(context.Background(), pool, 1, "processing", nil)
	var te *state.TransitionError
	if !sdk.IsPermanent(err) || !errors.As(err, &te) || te.From != "" || te.To != "processing" || te.Backward {
		t.Fatalf("NULL → processing = %v (permanent %v), want a permanent TransitionError from NULL", err, sdk.IsPermanent(err))
	}
	if !strings.Contains(err.Error(), "(NULL or empty) → processing") {
		t.Errorf("error %q does not name the NULL status", err)
	}
	var status *string
	if err := pool.QueryRow(context.Background(), "SELECT status FROM orders WHERE id = 1").Scan(&status); err != nil || status != nil {
		t.Errorf("row 1 status = %v, %v; want NULL, untouched", status, err)
	}
}
