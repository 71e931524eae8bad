package rabbitmq

import (
	"context"
	"errors"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

func TestOptionsValidated(t *testing.T) {
	for name, o := range map[string]Options{
		"queue type":     {QueueType: "stream"},
		"negative":       {Prefetch: -1},
		"prefetch":       {Prefetch: 70000},
		"tiny bucket":    {DelayBuckets: []time.Duration{time.Microsecond}},
		"huge bucket":    {DelayBuckets: []time.Duration{math.MaxInt64}},
		"negative limit": {MaxDeliveries: -2},
	} {
		if _, err := New(t.Context(), "amqp://guest:guest@127.0.0.1:5672/", o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
}

// TestCredentialsNeverInErrors: neither a bad URL nor a refused login nor an
// unreachable server puts the password in the error.
func TestCredentialsNeverInErrors(t *testing.T) {
	const secret = "s3cr3t-pa55"
	url := serverURL(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, u := range []string{
		"amqp://guest:" + secret + "@127.0.0.1:5672/",             // refused login
		"amqp://guest:" + secret + "@127.0.0.1:1/",                // nothing listening
		"amqp://guest:" + secret + "@127.0.0.1:5672/%zz",          // bad escape
		"http://guest:" + secret + "@127.0.0.1:5672/",             // wrong scheme
		"amqp://guest:" + secret + "@[::1:5672/",                  // unparsable host
		strings.Replace(url, "@", ":"+secret+"x@", 1) + "nowhere", // unknown vhost
	} {
		_, err := New(ctx, u, Options{})
		if err == nil {
			t.Errorf("New accepted a bad URL")
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error shows the password: %v", err)
		}
	}
	_, err := New(ctx, "amqp://guest:"+secret+"@127.0.0.1:1/", Options{})
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("unreachable server: %v, want ErrUnavailable", err)
	}
}

func TestBucketRoundsUp(t *testing.T) {
	b := &Broker{opts: Options{DelayBuckets: DefaultDelayBuckets}}
	for _, d := range []time.Duration{time.Nanosecond, 250 * time.Millisecond, 251 * time.Millisecond,
		time.Second, 2100 * time.Millisecond, 7 * time.Minute, 11 * time.Hour, sdk.MaxDelay} {
		got := b.bucket(d)
		if got < d {
			t.Errorf("bucket(%s) = %s: a retry would come early", d, got)
		}
		for _, ttl := range DefaultDelayBuckets {
			if ttl >= d && ttl < got {
				t.Errorf("bucket(%s) = %s, but %s is closer", d, got, ttl)
			}
		}
	}
}

// TestUnroutable: without topology declaration, a publish to a missing
// queue comes back as an *UnroutableError wrapping sdk.ErrNotFound.
func TestUnroutable(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{NoDeclare: true, Logger: quiet})
	m := &sdk.Message{Type: "nowhere"}
	err := b.Publish(t.Context(), q, m, &sdk.Message{Type: "nowhere-2"})
	var ue *UnroutableError
	if !errors.As(err, &ue) || !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Publish to a missing queue: %v, want *UnroutableError", err)
	}
	var pe *sdk.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 2 || pe.Failed[m.ID] == nil {
		t.Fatalf("Publish to a missing queue: %v, want a PublishError naming both messages", err)
	}
	// The channel survives a return: the next publish to a real queue works.
	if err := b.DeclareQueue(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(t.Context(), q, &sdk.Message{Type: "somewhere"}); err != nil {
		t.Fatalf("Publish after a return: %v", err)
	}
}

// TestReservedHeaders: headers RabbitMQ owns are refused before publishing.
func TestReservedHeaders(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	for _, h := range []string{"x-death", "x-delivery-count", "CC", "BCC", strings.Repeat("h", 256)} {
		err := b.Publish(t.Context(), q, &sdk.Message{Type: "t", Headers: map[string]string{h: "v"}})
		if !errors.Is(err, sdk.ErrInvalidHeader) {
			t.Errorf("header %.20q: %v, want ErrInvalidHeader", h, err)
		}
	}
	err := b.Publish(t.Context(), q, &sdk.Message{Type: strings.Repeat("t", 256)})
	if !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("256-byte Type: %v, want ErrInvalidMessage", err)
	}
}

// TestInfo: depth, consumers, delayed and dead-lettered counts.
func TestInfo(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Prefetch: 1, Logger: quiet})
	ctx := t.Context()
	if _, err := b.Info(ctx, q); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Info of a missing queue: %v, want ErrNotFound", err)
	}
	delayed := &sdk.Message{Type: "later", Delay: time.Hour}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "a"}, &sdk.Message{Type: "b"}, delayed); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := b.Info(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		// Prefetch 1: the consumer holds the second message, unacked.
		if info.Ready == 0 && info.Consumers == 1 && info.Delayed == 1 && info.DeadLettered == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Info = %+v, want 0 ready, 1 consumer, 1 delayed, 1 dead-lettered", info)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestInfoLooksUpMissingDelayQueuesOnce: Info looks each delay queue up by
// name, and a missing one costs a channel and an error in the server's log;
// one found missing is not looked up again until absentRecheck has passed,
// unless this Broker declares it (a delayed publish), and one another
// process declares is counted once absentRecheck has passed.
func TestInfoLooksUpMissingDelayQueuesOnce(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx := t.Context()
	var mu sync.Mutex
	looked := map[string]int{}
	b.inspectHook = func(name string) { mu.Lock(); looked[name]++; mu.Unlock() }
	lookups := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		m := maps.Clone(looked)
		clear(looked)
		return m
	}
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	info := func() QueueInfo {
		t.Helper()
		i, err := b.Info(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	info()
	if got, want := len(lookups()), 2+len(b.opts.DelayBuckets); got != want {
		t.Fatalf("first Info looked up %d queues, want %d (main, dead letters, every delay queue)", got, want)
	}
	info()
	if got := lookups(); len(got) != 2 || got[q] != 1 || got[DeadLetterQueue(q)] != 1 {
		t.Fatalf("second Info looked up %v, want the main and dead-letter queues only", got)
	}

	// A delayed publish of this Broker declares a delay queue: counted at once.
	if err := b.Publish(ctx, q, &sdk.Message{Type: "later", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if i := info(); i.Delayed != 1 {
		t.Fatalf("Info after a delayed publish: %+v, want 1 delayed", i)
	}
	if got := lookups(); got[DelayQueue(q, b.bucket(time.Hour))] != 1 {
		t.Fatalf("Info after a delayed publish looked up %v, without the declared delay queue", got)
	}

	// Another process declares a second delay queue: counted once the
	// missing one is looked up again.
	other := newBroker(t, url, Options{Logger: quiet})
	if err := other.Publish(ctx, q, &sdk.Message{Type: "soon", Delay: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if i := info(); i.Delayed != 1 {
		t.Fatalf("Info within absentRecheck of the lookup: %+v, want the other process's delay queue not yet counted", i)
	}
	b.mu.Lock()
	b.absentRecheck = 0
	b.mu.Unlock()
	if i := info(); i.Delayed != 2 {
		t.Fatalf("Info after absentRecheck: %+v, want 2 delayed", i)
	}
}

// TestExtendLeaseNoop: ExtendLease succeeds while the delivery is held (the
// server has no lease to extend) and reports a settled delivery.
func TestExtendLeaseNoop(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx := t.Context()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "long"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].ExtendLease(ctx, time.Hour); err != nil {
		t.Errorf("ExtendLease of a held delivery: %v, want nil", err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].ExtendLease(ctx, time.Hour); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("ExtendLease after Ack: %v, want ErrAlreadySettled", err)
	}
}
