package pause_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// Each process runs Sync beside its Worker; `berth queue pause emails -db …`
// (or the dashboard) then pauses emails in all of them within the interval.
func ExampleSync() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pause.NewPG(pool, pause.PGOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()
	w, err := sdk.NewWorker(broker, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "reports"}, {Name: "emails"}}})
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range w.Queues() { // held until Sync's first read of the table
		_ = w.Pause(q)
	}
	ctx, cancel := context.WithCancel(ctx) // ends Sync when the Worker returns
	defer cancel()
	synced := make(chan error, 1)
	go func() { synced <- pause.Sync(ctx, w, store, pause.SyncOptions{}) }()
	err = w.Run(ctx)
	cancel()
	<-synced
	if err != nil {
		log.Fatal(err)
	}
}
