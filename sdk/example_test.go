package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

type Charge struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// A Worker runs a handler on every job of a queue and settles each delivery
// from the handler's result: here one job succeeds and one is dead-lettered
// because its payload breaks a business rule.
func Example() {
	ctx := context.Background()
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()

	var mu sync.Mutex
	done := make(chan struct{}, 2)
	router := sdk.NewRouter()
	router.Register("billing.charge", sdk.JSON(func(ctx context.Context, d sdk.Delivery, c Charge) error {
		defer func() { done <- struct{}{} }()
		if c.Amount <= 0 {
			return sdk.Permanent(fmt.Errorf("order %s: amount %d", c.OrderID, c.Amount))
		}
		mu.Lock()
		fmt.Printf("charged %s %d\n", c.OrderID, c.Amount)
		mu.Unlock()
		return nil
	}))

	w, _ := sdk.NewWorker(broker, router, sdk.WorkerOptions{
		Queue:       "billing",
		Concurrency: 1,
		Logger:      slog.New(slog.DiscardHandler),
	})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- w.Run(runCtx) }()

	for _, c := range []Charge{{"order_1", 1200}, {"order_2", -5}} {
		m, _ := sdk.NewJSON("billing.charge", c)
		m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
		_ = broker.Publish(ctx, "billing", m)
	}
	<-done
	<-done
	stop()
	<-ran

	dead, _ := broker.ListDeadLetters(ctx, "billing", 10)
	for _, m := range dead {
		fmt.Println("dead letter:", m.IdempotencyKey, "-", m.Header(sdk.HeaderDeadLetterReason))
	}
	// Output:
	// charged order_1 1200
	// dead letter: charge:order_2:v1 - permanent: order order_2: amount -5
}

// Backoff delays grow exponentially up to Max; the jitter (here none) is
// drawn by the Worker.
func ExampleBackoff_Delay() {
	b := sdk.Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: -1}
	for attempt := 1; attempt <= 5; attempt++ {
		fmt.Println(attempt, b.Delay(attempt, 0))
	}
	// Output:
	// 1 100ms
	// 2 200ms
	// 3 400ms
	// 4 800ms
	// 5 1s
}

// Handlers steer settlement with typed errors; Classify names the class the
// Worker acts on.
func ExampleClassify() {
	for _, err := range []error{
		nil,
		errors.New("connection reset"),
		sdk.Permanent(errors.New("order missing")),
		sdk.RetryAfter(errors.New("rate limited"), 30*time.Second),
	} {
		fmt.Printf("%q\n", sdk.Classify(err))
	}
	// Output:
	// ""
	// "transient"
	// "permanent"
	// "retry_after"
}

// An unknown job type is a permanent failure: dead-lettered with a reason,
// never redelivered in a loop.
func ExampleRouter() {
	r := sdk.NewRouter()
	r.RegisterFunc("email.welcome", func(context.Context, sdk.Delivery) error { return nil })
	d := newFake(1, "email.goodbye")
	err := r.Handle(context.Background(), d)
	fmt.Println(errors.Is(err, sdk.ErrUnknownJobType), sdk.IsPermanent(err))
	// Output:
	// true true
}

// During a rolling deploy in which producers ship a new job type first, old
// consumers hand such jobs back (without consuming an attempt) instead of
// dead-lettering them, until a consumer that knows the type takes them.
func ExampleRouter_HandleUnknown() {
	r := sdk.NewRouter()
	r.RegisterFunc("email.welcome", func(context.Context, sdk.Delivery) error { return nil })
	r.HandleUnknown(sdk.RetryUnknown(30 * time.Second))
	err := r.Handle(context.Background(), newFake(1, "email.digest"))
	var ra *sdk.RetryAfterError
	fmt.Println(errors.Is(err, sdk.ErrUnknownJobType), errors.As(err, &ra), ra.Delay)
	fmt.Println(err)
	// Output:
	// true true 30s
	// retry after 30s: berth: unknown job type "email.digest"
}

// Decode ignores fields it does not know (a newer producer's) and rejects a
// body of the wrong shape with a permanent error.
func ExampleDecode() {
	c, err := sdk.Decode[Charge](&sdk.Message{Body: []byte(`{"order_id":"o1","amount":5,"currency":"EUR"}`)})
	fmt.Println(c.OrderID, c.Amount, err)
	_, err = sdk.Decode[Charge](&sdk.Message{ID: "m1", Type: "billing.charge", Body: []byte(`{"order_id":42}`)})
	fmt.Println(errors.Is(err, sdk.ErrUndecodable), sdk.IsPermanent(err))
	// Output:
	// o1 5 <nil>
	// true true
}

// CheckConfig finds the options a Worker would contradict its broker with:
// here MaxAttempts 8 on a broker that dead-letters after 5 deliveries.
// NewWorker logs the same conflicts, or refuses them with StrictConfig.
func ExampleCheckConfig() {
	broker, _ := memory.New(memory.Options{MaxDeliveries: 5})
	defer broker.Close()
	opts := sdk.WorkerOptions{Queue: "billing", Retry: sdk.RetryPolicy{MaxAttempts: 8}}
	conflicts, _ := sdk.CheckConfig(broker, opts)
	for _, c := range conflicts {
		fmt.Println(c.ID)
	}
	opts.StrictConfig = true
	_, err := sdk.NewWorker(broker, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), opts)
	fmt.Println(errors.Is(err, sdk.ErrConfigConflict))
	// Output:
	// worker.max-attempts-over-broker-cap
	// true
}

// ChargeOrder is the payload of the "billing.charge" job: its Kind ties
// the payload to the job type for producers and handlers alike.
type ChargeOrder struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

// Kind names the job type.
func (ChargeOrder) Kind() string { return "billing.charge" }

// IdempotencyKey names the business operation.
func (c ChargeOrder) IdempotencyKey() string { return "charge:" + c.OrderID + ":v1" }

// Typed jobs: the handler is registered for, and the message created from,
// the payload type.
func ExampleHandleJob() {
	r := sdk.NewRouter()
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[ChargeOrder]) error {
		fmt.Println("charging", j.Args.OrderID, j.Args.Cents, "at attempt", j.Delivery.Attempt())
		return nil
	})
	m, err := sdk.NewJob(ChargeOrder{OrderID: "o1", Cents: 4200})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.Type, m.IdempotencyKey)
	if err := r.Handle(context.Background(), berthtest.NewDelivery(m)); err != nil {
		fmt.Println(err)
	}
	// Output:
	// billing.charge charge:o1:v1
	// charging o1 4200 at attempt 1
}
