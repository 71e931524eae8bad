package sdk_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// One Worker serves two queues, three receives of "interactive" for one of
// "bulk" while both have work; Pause holds "bulk" without touching the jobs
// the Worker already holds.
func ExampleWorkerQueue() {
	ctx := context.Background()
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()
	for range 40 {
		_ = broker.Publish(ctx, "interactive", &sdk.Message{Type: "render"})
		_ = broker.Publish(ctx, "bulk", &sdk.Message{Type: "export"})
	}
	var mu sync.Mutex
	var order []string
	all := make(chan struct{})
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if order = append(order, d.Queue()); len(order) == 40 {
			close(all)
		}
		return nil
	})
	w, _ := sdk.NewWorker(broker, h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(slog.DiscardHandler),
		Queues: []sdk.WorkerQueue{{Name: "interactive", Weight: 3}, {Name: "bulk", Weight: 1}}})
	_ = w.Pause("bulk") // before Run: the Worker starts with bulk paused
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	<-all
	stop()
	<-done
	n := map[string]int{}
	for _, q := range order {
		n[q]++
	}
	fmt.Println("while bulk was paused:", n["interactive"], "interactive,", n["bulk"], "bulk")
	fmt.Println("paused:", w.Health().Paused)
	// Output:
	// while bulk was paused: 40 interactive, 0 bulk
	// paused: [bulk]
}

// LongDelay carries a delay past the broker's limit in hops: the broker never
// sees more than Limit, and the due time travels in the berth-due-at header.
func ExampleLongDelay() {
	ctx := context.Background()
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()
	ld := sdk.LongDelay{Publisher: broker, Limit: 15 * time.Minute}
	m := &sdk.Message{Type: "subscription.renew", Delay: 30 * 24 * time.Hour}
	if err := ld.Publish(ctx, "renewals", m); err != nil {
		fmt.Println(err)
		return
	}
	due, _ := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderDueAt))
	fmt.Println("broker delay:", m.Delay)
	fmt.Println("due in about:", time.Until(due).Round(24*time.Hour))
	// The consumer puts ld.Middleware() first in WorkerOptions.Middleware.
	// Output:
	// broker delay: 15m0s
	// due in about: 720h0m0s
}
