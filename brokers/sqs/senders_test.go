package sqs_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestSharedSendPanicReachesCaller: a panic in a shared SendMessageBatch
// call (a client middleware, say), which runs on a sender goroutine of the
// broker's, is raised in the goroutine of the Publish that sent the call,
// where it can be recovered (the Worker recovers a handler's), not on the
// sender, where it would end the process. The other Publish of that call
// returns an error instead of waiting for ever, and the broker's one sender
// is free again: a later Publish goes through.
func TestSharedSendPanicReachesCaller(t *testing.T) {
	b, q, outcomes := sharedPanic(t, "sendpanic", func(context.Context, middleware.InitializeInput, middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
		panic("boom")
	})
	ctx := testCtx(t)
	panicked, failed := 0, 0
	for _, o := range outcomes {
		switch {
		case o.recovered == "boom":
			panicked++
		case o.recovered != nil:
			t.Errorf("recovered %v from Publish, want the call's panic \"boom\"", o.recovered)
		case o.err != nil:
			failed++
		}
	}
	if panicked != 1 || failed != 1 {
		t.Fatalf("of the two Publish calls sharing the call that panicked, %d panicked and %d failed, want 1 and 1: %+v", panicked, failed, outcomes)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "after", Body: []byte("3")}); err != nil {
		t.Fatalf("Publish after a call panicked: %v", err)
	}
}

// TestSharedSendPanicWithdrawsCallersEntries: a Publish whose shared call
// panics, when that call carried others' entries and not all of its own,
// has its entries still queued withdrawn as the panic goes through: none is
// left for a later Publish to send long after this one ended.
//
// PublishSenders 2, deterministic: a full call (F, 10 messages) and a
// partial one (H, holding the queue's partial token) are held in flight.
// P1 queues 9 messages and waits for the partial token; P2 queues 2, which
// fill a call, and waits for a sender. F's return frees one for P2 alone,
// which takes the 10 oldest (P1's 9 and its own first) and sends them in
// the call that panics; P2's second message is still queued.
func TestSharedSendPanicWithdrawsCallersEntries(t *testing.T) {
	releaseF, releaseH := make(chan struct{}), make(chan struct{})
	arrived := make(chan struct{}, 2)
	var n atomic.Int32
	boom := onOperation("SendMessageBatch", func(ctx context.Context) error {
		hold := func(release chan struct{}) error {
			arrived <- struct{}{}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		switch n.Add(1) {
		case 1:
			return hold(releaseF)
		case 2:
			return hold(releaseH)
		case 3:
			panic("boom")
		}
		return nil
	})
	b := newBroker(t, sqs.Options{PublishSenders: 2}, boom)
	q := declare(t, b, "sendpanicw", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	msgs := func(typ string, k int) []*sdk.Message {
		out := make([]*sdk.Message, k)
		for i := range out {
			out[i] = &sdk.Message{Type: typ, Body: []byte("x")}
		}
		return out
	}

	f, h := make(chan error, 1), make(chan error, 1)
	go func() { f <- b.Publish(ctx, q, msgs("f", 10)...) }()
	<-arrived
	go func() { h <- b.Publish(ctx, q, msgs("h", 1)...) }()
	<-arrived

	p1 := make(chan error, 1)
	go func() { p1 <- b.Publish(ctx, q, msgs("p1", 9)...) }()
	waitQueued(t, b, 9)
	waitGoroutines(t, 1, "[select", "sqs.(*Broker).publishShared(") // P1 waits for the token: it found 9 queued
	p2 := make(chan any, 1)
	go func() {
		defer func() { p2 <- recover() }()
		_ = b.Publish(ctx, q, msgs("p2", 2)...)
	}()
	waitQueued(t, b, 11)
	waitGoroutines(t, 2, "[select", "sqs.(*Broker).publishShared(")
	close(releaseF)
	if err := <-f; err != nil {
		t.Fatalf("F: %v", err)
	}
	if v := <-p2; v != "boom" {
		t.Fatalf("recovered %v from P2's Publish, want the call's panic \"boom\"", v)
	}
	if err := <-p1; err == nil {
		t.Fatal("P1's Publish, whose messages went in the call that panicked, returned nil")
	}
	if left := sqs.QueuedShared(b); left != 0 {
		t.Fatalf("%d entries still queued after P2's Publish panicked, want 0: a later Publish would send them", left)
	}
	close(releaseH)
	if err := <-h; err != nil {
		t.Fatalf("H: %v", err)
	}
	if err := b.Publish(ctx, q, msgs("after", 1)...); err != nil {
		t.Fatalf("Publish after a call panicked: %v", err)
	}
}

// TestChunkPanicReachesCaller: a Publish of more than one chunk sends them
// on goroutines of its own; a panic in one's SendMessageBatch call (a client
// middleware's) is raised in the Publish caller's goroutine, where it can be
// recovered, not on the chunk's, where it ended the process. A call that
// exits its goroutine (runtime.Goexit) exits the caller's too, where the
// Publish returned nil as if that chunk were published. A later Publish
// goes through.
func TestChunkPanicReachesCaller(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func()
	}{
		{"panic", func() { panic("boom") }},
		{"goexit", runtime.Goexit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			end := onOperation("SendMessageBatch", func(context.Context) error {
				if n.Add(1) == 1 {
					tc.end()
				}
				return nil
			})
			b := newBroker(t, sqs.Options{}, end)
			q := declare(t, b, "chunkpanic", false, sqs.QueueConfig{})
			ctx := testCtx(t)
			msgs := make([]*sdk.Message, 11) // two chunks
			for i := range msgs {
				msgs[i] = &sdk.Message{Type: "chunk", Body: []byte("x")}
			}

			type outcome struct {
				returned  bool
				err       error
				recovered any
			}
			got := make(chan outcome, 1)
			go func() {
				var o outcome
				defer func() {
					o.recovered = recover()
					got <- o
				}()
				o.err = b.Publish(ctx, q, msgs...)
				o.returned = true
			}()
			o := <-got
			switch tc.name {
			case "panic":
				if o.recovered != "boom" {
					t.Fatalf("Publish: %+v, want the call's panic \"boom\" recovered", o)
				}
			case "goexit":
				if o.returned || o.recovered != nil {
					t.Fatalf("Publish: %+v, want its goroutine exited as the call's did", o)
				}
			}
			for i := range msgs {
				msgs[i] = &sdk.Message{Type: "after", Body: []byte("x")}
			}
			if err := b.Publish(ctx, q, msgs...); err != nil {
				t.Fatalf("Publish after a call ended abnormally: %v", err)
			}
		})
	}
}

// TestRedrivePanicReleasesHeldLetters: a panic in a redrive's
// SendMessageBatch call (a client middleware's), which the redrive's send
// raises in its caller, still makes the dead letters the scan holds visible
// again: they were hidden for the rest of the scan's hold (here 10 minutes;
// 30 s by default), and a scan right after could not see them.
func TestRedrivePanicReleasesHeldLetters(t *testing.T) {
	var armed atomic.Bool
	boom := onOperation("SendMessageBatch", func(context.Context) error {
		if armed.Load() {
			panic("boom")
		}
		return nil
	})
	b := newBroker(t, fastOptions(), boom)
	sqs.SetScanLimits(b, 10*time.Minute, 10000)
	q := declare(t, b, "redrivepanic", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	m := &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("x")}
	if err := b.Publish(ctx, q+"-dlq", m); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	got := make(chan any, 1)
	go func() {
		defer func() { got <- recover() }()
		_, _ = b.RedriveDeadLetters(ctx, q)
	}()
	if v := <-got; v != "boom" {
		t.Fatalf("recovered %v from RedriveDeadLetters, want the call's panic \"boom\"", v)
	}
	armed.Store(false)
	// A listing does not wait for letters held elsewhere: one the panicked
	// redrive left hidden is not found.
	ls, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(ls) != 1 || ls[0].ID != m.ID {
		t.Fatalf("ListDeadLetters after the redrive panicked = %d letters, %v; want the one dead letter", len(ls), err)
	}
}

// TestChunkPanicStopsFurtherChunks: once a call of a Publish of more chunks
// than it sends at once (10) has panicked, the Publish starts no further
// call: the panic tells the caller nothing of what was published, and the
// old code went on to send every remaining chunk before raising it. Ten
// calls start at once: the first panics once all ten are in flight, the
// other nine are held until the Publish waits for them; an eleventh would
// have started when the first gave up its place.
func TestChunkPanicStopsFurtherChunks(t *testing.T) {
	release, allIn := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	boom := onOperation("SendMessageBatch", func(ctx context.Context) error {
		k := n.Add(1)
		if k == 10 {
			close(allIn)
		}
		hold := func(c chan struct{}) error {
			select {
			case <-c:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		switch {
		case k == 1: // once the ten are all in flight
			err := hold(allIn)
			if err == nil {
				panic("boom")
			}
			return err
		case k <= 10:
			return hold(release)
		}
		return nil
	})
	b := newBroker(t, sqs.Options{}, boom)
	q := declare(t, b, "chunkstop", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	msgs := make([]*sdk.Message, 110) // 11 chunks
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "chunk", Body: []byte("x")}
	}
	got := make(chan any, 1)
	go func() {
		defer func() { got <- recover() }()
		_ = b.Publish(ctx, q, msgs...)
	}()
	select {
	case <-allIn:
	case <-ctx.Done():
		t.Fatalf("%d SendMessageBatch calls in flight, want 10", n.Load())
	}
	waitStack(t, "sync.(*WaitGroup).Wait(", "sqs.(*Broker).send(")
	close(release)
	if v := <-got; v != "boom" {
		t.Fatalf("recovered %v from Publish, want the call's panic \"boom\"", v)
	}
	if calls := n.Load(); calls != 10 {
		t.Fatalf("%d SendMessageBatch calls, want 10: none started after one panicked", calls)
	}
}

// waitStack waits until a goroutine's stack holds every one of frames.
func waitStack(t *testing.T, frames ...string) {
	t.Helper()
	waitGoroutines(t, 1, frames...)
}

// waitGoroutines waits until n goroutines' stacks each hold every one of
// frames (as "[select" for a goroutine blocked in a select), reading the
// goroutines' stacks: the coalescer, singleflight and the chunk goroutines
// do not tell who waits where.
func waitGoroutines(t *testing.T, n int, frames ...string) {
	t.Helper()
	ctx := testCtx(t)
	buf := make([]byte, 1<<20)
	for {
		dump := string(buf[:runtime.Stack(buf, true)])
		found := 0
	next:
		for _, g := range strings.Split(dump, "\n\n") {
			for _, f := range frames {
				if !strings.Contains(g, f) {
					continue next
				}
			}
			found++
		}
		if found >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d goroutines in %v, want %d", found, frames, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestSharedSendPanicAfterTheAnswerIsUncertain: a shared call whose client
// middleware panics once SQS has answered (the messages taken). The Publish
// that sent the call gets the panic; the other Publish of the call got an
// error that did not say its message may have been published, so that a
// caller (or the AsyncPool) sent it again. It now wraps sdk.ErrUnavailable.
func TestSharedSendPanicAfterTheAnswerIsUncertain(t *testing.T) {
	b, q, outcomes := sharedPanic(t, "sendpanicafter", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
		out, md, err := next.HandleInitialize(ctx, in)
		if err == nil { // once answered
			panic("boom")
		}
		return out, md, err
	})
	ctx := testCtx(t)
	failed := 0
	for _, o := range outcomes {
		switch {
		case o.recovered == "boom":
		case o.recovered != nil:
			t.Errorf("recovered %v from Publish, want the call's panic \"boom\"", o.recovered)
		case o.err == nil:
			t.Error("a Publish of the call that panicked returned nil")
		default:
			failed++
			if !errors.Is(o.err, sdk.ErrUnavailable) {
				t.Errorf("the other Publish of the call that panicked after SQS answered: %v, want sdk.ErrUnavailable (its message perhaps published)", o.err)
			}
		}
	}
	if failed != 1 {
		t.Fatalf("%d Publish calls failed without the panic, want 1: %+v", failed, outcomes)
	}
	// SQS took both messages of the call: the scenario happened.
	for _, d := range receiveN(t, b, q, 3) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// sharedOutcome is what one Publish of sharedPanic's shared call returned,
// or the panic it raised.
type sharedOutcome struct {
	err       error
	recovered any
}

// sharedPanic declares queue on a broker with one sender and runs two
// Publish calls of one message each that share one SendMessageBatch call:
// a first Publish's call holds the sender while both queue, then second
// runs as the shared call's middleware (in place of the handler chain's
// next step). It returns the broker, the queue and the two outcomes, once
// the first Publish has succeeded and both have returned.
func sharedPanic(t *testing.T, queue string, second func(context.Context, middleware.InitializeInput, middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error)) (*sqs.Broker, string, []sharedOutcome) {
	t.Helper()
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	var n atomic.Int32
	hold := func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthSendHold",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if awsmiddleware.GetOperationName(ctx) != "SendMessageBatch" {
					return next.HandleInitialize(ctx, in)
				}
				switch n.Add(1) {
				case 1: // holds the one sender while two Publish calls queue
					arrived <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
						return middleware.InitializeOutput{}, middleware.Metadata{}, ctx.Err()
					}
				case 2: // the call that carries both queued messages
					return second(ctx, in, next)
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
	b := newBroker(t, sqs.Options{PublishSenders: 1}, hold)
	q := declare(t, b, queue, false, sqs.QueueConfig{})
	ctx := testCtx(t)

	first := make(chan error, 1)
	go func() { first <- b.Publish(ctx, q, &sdk.Message{Type: "first", Body: []byte("1")}) }()
	<-arrived
	outcomes := make([]sharedOutcome, 2)
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Go(func() {
			defer func() { outcomes[i].recovered = recover() }()
			outcomes[i].err = b.Publish(ctx, q, &sdk.Message{Type: "queued", Body: []byte("2")})
		})
	}
	waitQueued(t, b, 2)
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	wg.Wait()
	return b, q, outcomes
}
