package rabbitmq

import (
	"context"
	"errors"
	"strings"
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
