package sqs_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// lookupHold counts GetQueueUrl calls and holds them: with hold set, the
// first call until its context ends; else every call until want calls
// arrived or a bounded pause passed (so that callers racing a cache miss
// overlap, whatever the scheduler does).
type lookupHold struct {
	calls atomic.Int64
	want  int64
	full  chan struct{}
	first chan struct{} // closed when the first call arrives
	hold  bool
}

func newLookupHold(want int64, hold bool) *lookupHold {
	return &lookupHold{want: want, full: make(chan struct{}), first: make(chan struct{}), hold: hold}
}

func (h *lookupHold) option(st *middleware.Stack) error {
	return onOperation("GetQueueUrl", func(ctx context.Context) error {
		n := h.calls.Add(1)
		if n == 1 {
			close(h.first)
		}
		if n == h.want {
			close(h.full)
		}
		switch {
		case h.hold && n == 1:
			<-ctx.Done()
			return ctx.Err()
		case !h.hold:
			select {
			case <-h.full:
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		return nil
	})(st)
}

// TestFirstPublishesShareOneLookup: many goroutines publishing to a queue
// the broker has not resolved yet (a service just started) make one
// GetQueueUrl call between them, not one each, and every publish lands.
func TestFirstPublishesShareOneLookup(t *testing.T) {
	ctx := testCtx(t)
	q := declare(t, newBroker(t, sqs.Options{}), "lookup", false, sqs.QueueConfig{})
	const callers = 32
	h := newLookupHold(callers, false)
	b := newBroker(t, sqs.Options{}, h.option) // a broker that never saw q
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if err := b.Publish(ctx, q, &sdk.Message{Type: "lookup", Body: []byte("x")}); err != nil {
				t.Errorf("Publish: %v", err)
			}
		})
	}
	wg.Wait()
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("%d concurrent publishes made %d GetQueueUrl calls, want 1", callers, n)
	}
	receiveEach(t, b, q, callers, func(d sdk.Delivery) {
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	})
}

// TestLookupOutlivesItsCaller: when the caller whose GetQueueUrl the others
// wait for gives up (its context ends), that caller gets its context's
// error and the others, whose contexts are alive, resolve the queue
// themselves rather than fail with an error that is not theirs.
func TestLookupOutlivesItsCaller(t *testing.T) {
	ctx := testCtx(t)
	q := declare(t, newBroker(t, sqs.Options{}), "lookupcancel", false, sqs.QueueConfig{})
	h := newLookupHold(0, true)
	b := newBroker(t, sqs.Options{}, h.option)

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leader := make(chan error, 1)
	go func() { leader <- b.Publish(lctx, q, &sdk.Message{Type: "lookup", Body: []byte("leader")}) }()
	select {
	case <-h.first:
	case <-ctx.Done():
		t.Fatal("the first publish made no GetQueueUrl call")
	}
	const followers = 4
	errs := make(chan error, followers)
	for range followers {
		go func() { errs <- b.Publish(ctx, q, &sdk.Message{Type: "lookup", Body: []byte("follower")}) }()
	}
	// Once the followers wait for the call under way, end its caller.
	waitGoroutines(t, 1+followers, "[select", "sqs.(*Broker).queue(") // waiting for the shared lookup, past joining it
	cancel()
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled publish returned %v, want context.Canceled", err)
	}
	for range followers {
		if err := <-errs; err != nil {
			t.Fatalf("a publish with a live context failed with another caller's error: %v", err)
		}
	}
	if n := h.calls.Load(); n < 2 {
		t.Fatalf("%d GetQueueUrl calls, want the held one and at least one more", n)
	}
	receiveEach(t, b, q, followers, func(d sdk.Delivery) {
		if string(d.Message().Body) != "follower" {
			t.Fatalf("received %q, want only the followers' messages", d.Message().Body)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	})
}

// TestLookupTimeoutIsItsError: a lookup that fails because the transport
// timed out (an error that also matches context.DeadlineExceeded) while
// its caller's context is alive is that caller's error, ErrUnavailable;
// the caller does not call again and again until its own context ends.
func TestLookupTimeoutIsItsError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var conns sync.WaitGroup
	held := make(chan struct{})
	conns.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns.Go(func() { <-held; _ = c.Close() }) // never answers
		}
	})
	tr := &http.Transport{}
	t.Cleanup(func() {
		_ = ln.Close()
		close(held)
		conns.Wait()
		tr.CloseIdleConnections()
	})
	client := awssqs.New(awssqs.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String("http://" + ln.Addr().String()),
		Credentials:      credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:       &http.Client{Transport: tr, Timeout: 200 * time.Millisecond},
		RetryMaxAttempts: 1,
	})
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Publish(testCtx(t), "lookup_timeout", &sdk.Message{Type: "lookup", Body: []byte("x")})
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Publish after a transport timeout returned %v, want ErrUnavailable", err)
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for one lookup of one attempt, want 1", n)
	}
}

// TestLookupPanicReachesCaller: a panic in the shared lookup (a client
// middleware, say) is raised in the caller's goroutine, where it can be
// recovered, not in a goroutine of the broker's, where it would end the
// process.
func TestLookupPanicReachesCaller(t *testing.T) {
	boom := onOperation("GetQueueUrl", func(context.Context) error { panic("boom") })
	b := newBroker(t, sqs.Options{}, boom)
	got := func() (p any) {
		defer func() { p = recover() }()
		_ = b.Publish(testCtx(t), "lookup_panic", &sdk.Message{Type: "lookup", Body: []byte("x")})
		return nil
	}()
	if got != "boom" {
		t.Fatalf("recovered %v from Publish, want the lookup's panic \"boom\"", got)
	}
}
