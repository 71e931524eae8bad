package rabbitmq

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestForeignHeaderValuesKeptByCopies: a message published outside berth
// may carry header values of any AMQP type (numbers, booleans, byte
// arrays, nested tables and arrays) and properties Message has no field
// for (content type and encoding, app ID, reply-to, priority).
// Message.Headers shows only the string headers, but the copies berth
// publishes for it — Retry's, DeadLetter's and a redrive's — must not drop
// the rest: the dead letter is the message kept for whoever looks into the
// failure. Before, every copy was built from the decoded Message alone and
// lost them.
func TestForeignHeaderValuesKeptByCopies(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	foreign := amqp.Table{
		"count":  int32(7),
		"big":    int64(1) << 40,
		"ratio":  float64(0.5),
		"flag":   true,
		"bin":    []byte{0xff, 0x00, 0x01},
		"nested": amqp.Table{"k": "v", "n": int32(2)},
		"list":   []any{"a", int32(1)},
	}
	headers := amqp.Table{"plain": "text"}
	for k, v := range foreign {
		headers[k] = v
	}
	ch := ownChannel(t, url, true)
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
		MessageId: "foreign-1", Type: "foreign", DeliveryMode: amqp.Persistent, Headers: headers, Body: []byte("x"),
		ContentType: "application/json", ContentEncoding: "identity", AppId: "billing", ReplyTo: "replies", Priority: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	receive := func() sdk.Delivery {
		t.Helper()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := ds[0].Message(); got.ID != "foreign-1" || got.Header("plain") != "text" {
			t.Fatalf("received %s with headers %v", got.ID, got.Headers)
		}
		return ds[0]
	}
	if err := receive().Retry(ctx, 0, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
	if err := receive().DeadLetter(ctx, errors.New("permanent")); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); n != 1 || err != nil {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	if err := receive().DeadLetter(ctx, errors.New("permanent again")); err != nil {
		t.Fatal(err)
	}

	// The dead letter as the server holds it.
	var d amqp.Delivery
	for {
		var ok bool
		d, ok, err = ch.Get(DeadLetterQueue(q), false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no dead letter")
		case <-time.After(20 * time.Millisecond):
		}
	}
	for k, want := range foreign {
		if got, ok := d.Headers[k]; !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("dead letter header %q = %#v (present %v), want %#v", k, got, ok, want)
		}
	}
	if d.Headers["plain"] != "text" || d.Headers[sdk.HeaderDeadLetterReason] != "permanent again" {
		t.Errorf("dead letter headers %v", d.Headers)
	}
	if d.ContentType != "application/json" || d.ContentEncoding != "identity" || d.AppId != "billing" ||
		d.ReplyTo != "replies" || d.Priority != 3 {
		t.Errorf("dead letter properties: content type %q, encoding %q, app ID %q, reply-to %q, priority %d",
			d.ContentType, d.ContentEncoding, d.AppId, d.ReplyTo, d.Priority)
	}
}

// TestAttemptHeaderNeverWraps: the attempt header is a header like any
// other, which a producer outside berth (or a corrupted message) can set
// to any number. Attempt() must stay at least 1 and never go down: a
// Retry's copy carries Attempt()+1 and a crash redelivery adds the
// quorum queue's x-delivery-count. Before, a header of MaxInt made a
// Retry's copy carry MinInt (dropped by encode: the attempts started again
// at 1) and a crash redelivery report a negative Attempt().
func TestAttemptHeaderNeverWraps(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	ch := ownChannel(t, url, true)
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
		MessageId: "forged-attempt", Type: "forged", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{sdk.HeaderAttempt: strconv.Itoa(math.MaxInt)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	prev := 1
	receive := func(how string) sdk.Delivery {
		t.Helper()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if a := ds[0].Attempt(); a < prev {
			t.Fatalf("%s: Attempt() %d, below %d", how, a, prev)
		}
		prev = ds[0].Attempt()
		return ds[0]
	}
	if err := receive("first delivery").Retry(ctx, 0, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
	receive("after Retry").(*delivery).abandon() // a crash: the server redelivers with x-delivery-count
	if err := receive("after a crash").Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFractionalBucketNeverEarly: a delay queue's TTL (x-message-ttl) and
// its name are in whole milliseconds. A bucket that is not a whole number
// of them (Options.DelayBuckets accepts any bucket of at least 1ms) must
// not make its TTL shorter than the delays it takes, nor share its delay
// queue with another bucket. Before, a 1.5ms bucket got a TTL of 1ms and
// the name of the 1ms bucket: a delay of 1.4ms was delivered after 1ms,
// early, against "a message is never delivered early".
func TestFractionalBucketNeverEarly(t *testing.T) {
	o, err := Options{DelayBuckets: []time.Duration{time.Millisecond, 1500 * time.Microsecond, 2500 * time.Microsecond}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	b := &Broker{opts: o}
	ttlOf := map[string]time.Duration{}
	for _, d := range []time.Duration{time.Millisecond, 1400 * time.Microsecond, 1500 * time.Microsecond, 2200 * time.Microsecond, 2500 * time.Microsecond} {
		bucket := b.bucket(d)
		ttl := time.Duration(b.delayArgs("q", bucket)["x-message-ttl"].(int64)) * time.Millisecond
		if ttl < d {
			t.Errorf("delay %s: bucket %s, TTL %s: delivered early", d, bucket, ttl)
		}
		name := DelayQueue("q", bucket)
		if other, ok := ttlOf[name]; ok && other != ttl {
			t.Errorf("delay queue %s has TTL %s and %s", name, other, ttl)
		}
		ttlOf[name] = ttl
	}
}
