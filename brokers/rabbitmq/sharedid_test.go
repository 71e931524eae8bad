package rabbitmq

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// The copies berth makes of delivered messages (Close's and a pause's
// hand-back, a delay queue's mover, a dead-letter walk) carry the IDs their
// producers gave them, and a producer outside berth often gives none: many
// messages share the empty ID. The tests here have two such messages, one
// whose copy the server takes and one whose copy it refuses, and check
// that each original is settled by its own copy's outcome. Before, the
// outcomes were keyed by message ID: the refusal of one was taken for the
// other's too, whose original then stayed beside its copy (a duplicate).

// refusePolicy makes queue name refuse every publish beyond limit ready
// messages (basic.nack: max-length with overflow reject-publish), through a
// policy set with rabbitmqctl, and waits until it is in force. It returns
// the function that lifts it (also run when the test ends).
func refusePolicy(t *testing.T, name string, limit int) (lift func()) {
	t.Helper()
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Skip("rabbitmqctl not on PATH: the server is not local, no policy can be set")
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(ctl, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	policy := "berth-refuse-" + name
	run("set_policy", "--apply-to", "queues", "--priority", "999", policy,
		"^"+regexp.QuoteMeta(name)+"$", `{"max-length":`+strconv.Itoa(limit)+`,"overflow":"reject-publish"}`)
	lifted := false
	lift = func() {
		if !lifted {
			lifted = true
			run("clear_policy", policy)
		}
	}
	t.Cleanup(lift)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out := run("list_queues", "-q", "--no-table-headers", "name", "policy")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name && f[1] == policy {
				return lift
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("policy %s never applied to %s", policy, name)
		}
	}
}

// publishRaw publishes a message with body to queue as a producer outside
// berth would, with no message ID, and waits for its confirm.
func publishRaw(t *testing.T, ch *amqp.Channel, queue, body string) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(t.Context()); err != nil || !ok {
		t.Fatalf("publish %q to %s: confirmed %v, %v", body, queue, ok, err)
	}
}

// queueBodies reads every message of queue with a connection of its own
// and returns their bodies, sorted; closing the connection returns them.
func queueBodies(t *testing.T, url, queue string) []string {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			slices.Sort(out)
			return out
		}
		out = append(out, string(d.Body))
	}
}

// waitReady waits until queue holds n ready messages.
func waitReady(t *testing.T, ch *amqp.Channel, queue string, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d ready messages, want %d", queue, q.Messages, n)
		}
	}
}

// TestHandBackSharedIDs: Close hands back two prefetched messages without
// IDs; the queue takes the first copy and refuses the second. The first
// original is acked (its copy is in the queue), the second goes back with
// the channel: each message is in the queue once. Before, the refusal was
// recorded under the empty ID and taken for the first message's too: its
// original went back beside its copy, delivered twice.
func TestHandBackSharedIDs(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{QueueType: Classic, Prefetch: 10, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	ch := ownChannel(t, url, true)
	for _, body := range []string{"0", "1", "2"} {
		publishRaw(t, ch, q, body)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ch, q, 0) // the other two are prefetched: unacked, not counted by max-length
	lift := refusePolicy(t, q, 1)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	lift()
	got := queueBodies(t, url, q)
	want := slices.DeleteFunc([]string{"0", "1", "2"}, func(s string) bool { return s == string(ds[0].Message().Body) })
	if !slices.Equal(got, want) {
		t.Fatalf("after Close handed back %v (one copy refused), the queue holds %v, want each once", want, got)
	}
}

// TestDelayMoverSharedIDs: a delay queue's mover moves two messages without
// IDs in one batch; the queue takes the first copy and refuses the second.
// The first is acked off the delay queue, the second nacked back to it, to
// be moved again: each message is on one queue once. Before, both originals
// were nacked back (the refusal keyed by the empty ID) beside the first
// one's copy, which arrived twice. The batch is taken here with basic.get
// and handed to the mover's move, as its session does once both are due
// (a session makes such a batch only when their arrivals fall within the
// timer's lateness: not something a test can arrange).
func TestDelayMoverSharedIDs(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	const ttl = time.Minute // nothing expires from the delay queue during the test
	b := newBroker(t, url, Options{QueueType: Classic, Logger: quiet, DelayBuckets: []time.Duration{ttl}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	bucket, err := b.ensureDelay(ctx, q, ttl)
	if err != nil {
		t.Fatal(err)
	}
	ch := ownChannel(t, url, true)
	publishRaw(t, ch, bucket, "0")
	publishRaw(t, ch, bucket, "1")
	lift := refusePolicy(t, q, 1)
	mch := ownChannel(t, url, false)
	var batch []heldMsg
	for len(batch) < 2 {
		d, ok, err := mch.Get(bucket, false)
		if err != nil || !ok {
			t.Fatalf("basic.get of the delay queue: %v, %v", ok, err)
		}
		batch = append(batch, heldMsg{d: d, due: time.Now()})
	}
	m := &mover{b: b, queue: q, bucket: bucket, ttl: ttl}
	if err := m.move(mch, batch); err != nil {
		t.Fatal(err)
	}
	lift()
	if got := queueBodies(t, url, q); !slices.Equal(got, []string{"0"}) {
		t.Errorf("the queue holds %v, want the copy the policy let in, [0]", got)
	}
	if got := queueBodies(t, url, bucket); !slices.Equal(got, []string{"1"}) {
		t.Fatalf("the delay queue holds %v, want the refused one alone, [1]: the moved one is on both queues", got)
	}
}

// TestWalkSharedIDs: a sweep redrives the first of two dead letters
// without IDs and keeps the second; the redrive fails (its queue is gone),
// the kept letter's copy is confirmed. The kept letter's original is acked:
// the dead-letter queue holds each letter once, and the sweep reports the
// failed redrive. Before, the failure was keyed by the empty ID and taken
// for the kept letter's too: its original went back beside its copy.
func TestWalkSharedIDs(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	b := newBroker(t, url, Options{Logger: quiet, NoDeclare: true})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	ch := ownChannel(t, url, true)
	publishRaw(t, ch, DeadLetterQueue(q), "a")
	publishRaw(t, ch, DeadLetterQueue(q), "b")
	admin := ownChannel(t, url, false)
	b.walkTune.afterCount = func() {
		// The redrive finds no queue (unroutable).
		if _, err := admin.QueueDelete(q, false, false, false); err != nil {
			t.Error(err)
		}
	}
	n, err := b.SweepDeadLetters(ctx, q, 0, true, func(done int, page []*sdk.Message) []bool {
		chosen := make([]bool, len(page))
		for i, m := range page {
			chosen[i] = string(m.Body) == "a"
		}
		return chosen
	})
	var pe *sdk.PublishError
	if n != 0 || !errors.As(err, &pe) || !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("SweepDeadLetters = %d, %v; want 0 and the failed redrive (unroutable)", n, err)
	}
	if got := queueBodies(t, url, DeadLetterQueue(q)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("the dead-letter queue holds %v, want [a b], each once", got)
	}
}
