package rabbitmq

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestFailedCopyKeepsOriginal: when the copy of Retry or DeadLetter cannot
// be published (its delay queue or dead-letter exchange does not exist),
// the settlement fails and the original comes back, its attempt counted;
// nothing is lost and the publisher recovers for the next message.
func TestFailedCopyKeepsOriginal(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The queue is declared with the default topology; the broker under
	// test never declares (NoDeclare), so its delay queues do not exist,
	// and it dead-letters through an exchange that does not exist either.
	if err := newBroker(t, url, Options{Logger: quiet}).DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, url, Options{NoDeclare: true, DeadLetterExchange: q + ".missing-dlx", Logger: quiet})
	m := &sdk.Message{Type: "copy-fails"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name   string
		settle func(d sdk.Delivery) error
		want   error
	}{
		{"Retry to a missing delay queue", func(d sdk.Delivery) error { return d.Retry(ctx, time.Minute, errors.New("boom")) }, sdk.ErrNotFound},
		{"DeadLetter to a missing exchange", func(d sdk.Delivery) error { return d.DeadLetter(ctx, errors.New("boom")) }, sdk.ErrNotFound},
	}
	for i, s := range steps {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := ds[0]
		if d.Message().ID != m.ID || d.Attempt() != i+1 {
			t.Fatalf("%s: got %s attempt %d, want %s attempt %d", s.name, d.Message().ID, d.Attempt(), m.ID, i+1)
		}
		if err := s.settle(d); !errors.Is(err, s.want) {
			t.Fatalf("%s: %v, want an error wrapping %v", s.name, err, s.want)
		}
		if err := d.Ack(ctx); !errors.Is(err, sdk.ErrAlreadySettled) {
			t.Errorf("%s: Ack after the failed settlement: %v, want ErrAlreadySettled", s.name, err)
		}
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Message().ID != m.ID || ds[0].Attempt() != 3 {
		t.Fatalf("after two failed settlements got %s attempt %d, want %s attempt 3", ds[0].Message().ID, ds[0].Attempt(), m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "after"}); err != nil {
		t.Fatalf("Publish after the publish channel was closed by a 404: %v", err)
	}
}

// TestQueueDeletedUnderConsumer: when the queue is deleted while consumed,
// the broker declares it again and resumes: the consumer comes back and
// Publish works again (its first try may report the queue missing).
func TestQueueDeletedUnderConsumer(t *testing.T) {
	// Classic: a quorum queue with max-length 0 confirms a publish and drops it.
	url, q, b := brokerOnQueue(t, Options{QueueType: Classic, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "before"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	deleteQueues(t, url, q)

	m := &sdk.Message{Type: "after"}
	for {
		err := b.Publish(ctx, q, m)
		if err == nil {
			break
		}
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("Publish after the queue was deleted: %v, want success or ErrNotFound", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ds, err = b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatalf("Receive after the queue was deleted and declared again: %v", err)
	}
	if ds[0].Message().ID != m.ID {
		t.Fatalf("received %s, want %s", ds[0].Message().ID, m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Info(ctx, DeadLetterQueue(q)); err != nil {
		t.Errorf("dead-letter queue not declared again: %v", err)
	}
}

// TestSettlementCopyRefusedIsSentAgain: while the server refuses the copy a
// settlement needs (basic.nack: here a policy makes the dead-letter queue
// reject every publish, as a quorum queue without a serving leader does),
// DeadLetter sends it again after a backoff instead of handing the
// delivery back at once. Before, each refusal redelivered the message at
// once, to be refused again: in the three-node cluster test the poison
// jobs went round ten times in 140 ms, reached the delivery limit and were
// left to the server's dead-lettering, which held them for minutes.
func TestSettlementCopyRefusedIsSentAgain(t *testing.T) {
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Skip("rabbitmqctl not on PATH: the server is not local, no policy can be set")
	}
	// Classic: a quorum queue with max-length 0 confirms a publish and drops it.
	url, q, b := brokerOnQueue(t, Options{QueueType: Classic, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	m := &sdk.Message{Type: "poison"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}

	policy := "berth-refuse-" + q
	ctlRun := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %v: %v: %s", args, err, out)
		}
	}
	ctlRun("set_policy", "--apply-to", "queues", "--priority", "999", policy,
		"^"+regexp.QuoteMeta(DeadLetterQueue(q))+"$", `{"max-length":0,"overflow":"reject-publish"}`)
	cleared := false
	clear := func() {
		if !cleared {
			cleared = true
			ctlRun("clear_policy", policy)
		}
	}
	t.Cleanup(clear)
	// Wait until the policy applies: a probe published to the dead-letter
	// queue is refused.
	ch := ownChannel(t, url, true)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", DeadLetterQueue(q), true, false, amqp.Publishing{Body: []byte("probe")})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil {
			t.Fatal(err)
		} else if !ok {
			break // refused: the policy is in force
		}
		if time.Now().After(deadline) {
			t.Fatal("the policy never made the dead-letter queue refuse a publish")
		}
		if _, err := ch.QueuePurge(DeadLetterQueue(q), false); err != nil {
			t.Fatal(err)
		}
	}

	// The queue takes copies again 500 ms into the DeadLetter.
	lifted := time.AfterFunc(500*time.Millisecond, clear)
	defer lifted.Stop()
	start := time.Now()
	if err := ds[0].DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatalf("DeadLetter while the dead-letter queue refused copies for 500ms: %v, want the copy sent again until taken", err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("DeadLetter returned after %v, before the policy was lifted: the refusal was not exercised", waited)
	}
	got, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(got) != 1 || got[0].ID != m.ID {
		t.Fatalf("ListDeadLetters = %d messages, %v; want %s once", len(got), err, m.ID)
	}
	info, err := b.Info(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if info.Ready != 0 {
		t.Fatalf("%d ready in the main queue after the dead-lettering, want 0: the original came back", info.Ready)
	}
}
