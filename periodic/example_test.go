package periodic_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// A nightly report on a cron schedule. The fake clock stands in for time so
// the example runs instantly; a program leaves Options.Clock empty.
func Example() {
	b, err := memory.New(memory.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	clock := periodic.NewFakeClock(time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC))
	s, err := periodic.New(b, periodic.Options{Clock: clock}, periodic.Job{
		Name:     "report.nightly",
		Schedule: periodic.MustCron("30 23 * * *"),
		Queue:    "reports",
		Message: func(slot time.Time) (*sdk.Message, error) {
			return sdk.NewJSON("report.nightly", map[string]string{"day": slot.Format(time.DateOnly)})
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	_ = clock.WaitSleepers(ctx, 1)
	clock.Advance(time.Hour) // 23:30 passes
	_ = clock.WaitSleepers(ctx, 1)
	cancel()
	<-done

	ds, err := b.Receive(context.Background(), "reports", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		m := d.Message()
		fmt.Println(m.Type, m.IdempotencyKey, string(m.Body))
		_ = d.Ack(context.Background())
	}
	// Output:
	// report.nightly periodic:report.nightly@2026-12-01T23:30:00Z {"day":"2026-12-01"}
}

// Every aligns its slots to the Unix epoch, so every scheduler computes the
// same ones whenever it starts.
func ExampleEvery() {
	s, err := periodic.Every(15*time.Minute, 5*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	t := time.Date(2026, 12, 1, 10, 7, 0, 0, time.UTC)
	for range 3 {
		t = s.Next(t)
		fmt.Println(t.Format(time.TimeOnly))
	}
	// Output:
	// 10:20:00
	// 10:35:00
	// 10:50:00
}
