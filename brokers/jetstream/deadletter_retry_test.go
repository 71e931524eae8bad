package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// A dead-letter move whose publish was stored but whose answer was lost
// (the process died before it acked the original) is done again by the
// next delivery, in another process: its dead letter's Nats-Msg-Id, which
// carries the store time the delivery read from its ack subject, must be
// the one the first attempt used, so that the dead-letter stream drops the
// second copy. Both the stored (berth) message and a foreign one without a
// Nats-Msg-Id (whose ID is derived from the store time too) end up as one
// dead letter each.
func TestDeadLetterRetriedAfterLostAnswerStoresOne(t *testing.T) {
	opts := testOpts
	opts.AckWait = 5 * time.Second // outlasts both attempts below
	direct := newBroker(t, opts)
	q := declare(t, direct, "dlretry")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := direct.Publish(ctx, q, &sdk.Message{ID: "berth-msg", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	publishRaw(t, direct, q, nil, "foreign")

	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{Name: "berth-test-dlretry", ReconnectWait: 50 * time.Millisecond}, opts)
	if err != nil {
		t.Fatal(err)
	}
	var ds []sdk.Delivery
	for len(ds) < 2 {
		got, err := b.Receive(ctx, q, 2-len(ds))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	// The dead letters reach the server, their answers do not: the
	// originals are not acked, as when the process dies right there.
	p.FreezeReplies()
	var first []string
	for _, d := range ds {
		first = append(first, d.Message().ID)
		dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := d.DeadLetter(dctx, sdk.Permanent(errors.New("bad")))
		dcancel()
		if err == nil {
			t.Fatalf("DeadLetter of %q with its answer lost succeeded", d.Message().ID)
		}
	}
	p.Reset()
	p.Thaw()
	_ = b.Close() // the first process is gone: its deliveries come back
	stored := func() []string {
		t.Helper()
		dls, err := direct.ListDeadLetters(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range dls {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if ids := stored(); len(ids) != 2 {
		t.Fatalf("after the attempts whose answers were lost: dead letters %q, want both stored", ids)
	}

	for range 2 {
		d := receiveOne(ctx, t, direct, q)
		if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	if ids := stored(); len(ids) != 2 || ids[0] != first[0] || ids[1] != first[1] {
		t.Fatalf("dead letters %q, want one of each of %q", ids, first)
	}
}
