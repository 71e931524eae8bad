package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestRetryChecksForeignFirstFailure: Retry's copy carries the first
// failure to the next attempt and to the dead letter. A message published
// outside berth may already carry a berth-first-failure header, forged or
// garbage; Retry copied it as it was, so it travelled on as if berth had
// written it. It is kept only as sdk.AnnotateDeadLetter keeps one: an RFC
// 3339 time not after now, rewritten in UTC; anything else becomes now.
func TestRetryChecksForeignFirstFailure(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		header string
		want   string // "" means the Retry's now
	}{
		{"yesterday", ""},
		{"<script>alert(1)</script>", ""},
		{"2999-01-01T00:00:00Z", ""}, // after now: a first failure after the last
		{"2001-02-03", ""},
		{"2001-02-03T04:05:06Z", "2001-02-03T04:05:06Z"},
		{"2001-02-03T05:05:06.5+01:00", "2001-02-03T04:05:06.5Z"},
	}
	ch := ownChannel(t, url, true)
	for i, c := range cases {
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			MessageId: "foreign-" + string(rune('a'+i)), Type: "foreign", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{sdk.HeaderFirstFailure: c.header}, Body: []byte("x"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
	}
	byID := map[string]string{}
	for i, c := range cases {
		byID["foreign-"+string(rune('a'+i))] = c.want
	}
	before := time.Now()
	for range cases {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := ds[0].Retry(ctx, 0, errors.New("transient")); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()
	for range cases {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		m := ds[0].Message()
		got := m.Header(sdk.HeaderFirstFailure)
		want, ok := byID[m.ID]
		if !ok {
			t.Fatalf("received %s", m.ID)
		}
		if want != "" {
			if got != want {
				t.Errorf("%s: berth-first-failure %q after Retry; want %q", m.ID, got, want)
			}
		} else if at, err := time.Parse(time.RFC3339Nano, got); err != nil || at.Before(before.Truncate(time.Microsecond)) ||
			at.After(after) || at.Location() != time.UTC {
			t.Errorf("%s: berth-first-failure %q after Retry; want the Retry's time, in UTC", m.ID, got)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
