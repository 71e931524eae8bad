package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
)

// In transactional mode a handler stages its writes on the memory
// transaction: they apply when the key commits, and not at all when the
// handler fails — as a PostgreSQL handler's writes through pgstore.TxFrom.
func Example() {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{})})
	if err != nil {
		log.Fatal(err)
	}
	balance := 0
	credit := func(fail bool) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			tx, _ := memstore.TxFrom(ctx)
			tx.OnCommit(func() { balance += 100 })
			if fail {
				return errors.New("ledger unavailable")
			}
			return nil
		}
	}
	op := idempotency.Operation{Key: "credit:acct_7:2026-11", JobType: "ledger.credit"}
	for _, fail := range []bool{true, false, false} {
		ran, err := g.Do(context.Background(), op, credit(fail))
		fmt.Printf("ran=%v err=%v balance=%d\n", ran, err, balance)
	}
	// Output:
	// ran=true err=ledger unavailable balance=0
	// ran=true err=<nil> balance=100
	// ran=false err=<nil> balance=100
}
