package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// dlqMsgs is how many messages q's dead-letter stream holds, read from the
// stream's state: no scan that could miss a letter on another subject.
func dlqMsgs(ctx context.Context, t *testing.T, b *jetstream.Broker, q string) uint64 {
	t.Helper()
	js, err := natsjs.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	_, dlq := b.StreamNames(q)
	s, err := js.Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestDeadLetterLeaseLostDuringPublish: the lease runs out while
// DeadLetter's copy is being stored (the connection stalls until the
// server has redelivered the message to another consumer). DeadLetter does
// not ack the original then and returns ErrLeaseLost; the copy it stored
// must not stay in the dead-letter stream, a dead letter of a job that
// runs on the other consumer (a redrive would run it twice). When that
// consumer dead-letters the message in turn, within the stream's
// Duplicates window (the copy's Nats-Msg-Id is the same), its dead letter
// is stored all the same, not dropped as a duplicate of the copy taken
// back: the message is then in the dead-letter stream once, and out of
// the queue.
func TestDeadLetterLeaseLostDuringPublish(t *testing.T) {
	const ackWait = 2 * time.Second
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
	ctx, p, direct, _, q, first := proxiedDelivery(t, opts, "dllapse")
	id := first.Message().ID
	t0 := time.Now()
	time.Sleep(ackWait * 3 / 4) // late in the lease

	second, err := stalledCall(ctx, t, p, direct, q, t0, ackWait, func() error {
		return first.DeadLetter(ctx, errors.New("bad"))
	})
	if !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("DeadLetter whose lease ran out while its copy was stored = %v; want ErrLeaseLost", err)
	}
	if second.Message().ID != id {
		t.Fatalf("redelivered %q, want %q", second.Message().ID, id)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 0 {
		t.Errorf("dead-letter stream holds %d messages after a DeadLetter whose lease was lost, while another consumer holds the message; want 0", n)
	}

	if err := second.DeadLetter(ctx, errors.New("bad again")); err != nil {
		t.Fatalf("second holder's DeadLetter: %v", err)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 1 {
		t.Errorf("dead-letter stream holds %d messages after the second holder's DeadLetter; want 1", n)
	}
	dls, err := direct.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].ID != id || dls[0].Header(sdk.HeaderDeadLetterReason) != "bad again" {
		t.Errorf("%d dead letters, want one of %q with the second holder's reason", len(dls), id)
		for _, m := range dls {
			t.Logf("dead letter %q, reason %q", m.ID, m.Header(sdk.HeaderDeadLetterReason))
		}
	}
	st, err := direct.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.InFlight != 0 || st.Delayed != 0 {
		t.Errorf("queue after the dead-lettering: %+v, want empty", st)
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDeadLetterLeaseLostCopyNotTakenBack: the lease runs out once
// DeadLetter's copy is stored, and the connection then stalls until
// DeadLetter's context ends, so that the copy cannot be deleted. DeadLetter
// still returns ErrLeaseLost (the original is not acked), and its error
// and the log say that the dead letter stays, naming it.
func TestDeadLetterLeaseLostCopyNotTakenBack(t *testing.T) {
	const ackWait = time.Second
	var logs lockedBuffer
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, p, direct, _, q, first := proxiedDelivery(t, opts, "dlstays")
	fired := false
	defer jetstream.SetDeadLetterHook(func() {
		if fired {
			return
		}
		fired = true
		time.Sleep(ackWait) // the lease runs out
		p.Freeze()
	})()
	dctx, cancel := context.WithTimeout(ctx, ackWait+500*time.Millisecond)
	err := first.DeadLetter(dctx, errors.New("bad"))
	cancel()
	p.Thaw()
	if !fired {
		t.Fatalf("DeadLetter returned %v before storing its copy", err)
	}
	if !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("DeadLetter whose lease ran out = %v; want ErrLeaseLost", err)
	}
	t.Logf("DeadLetter: %v", err)
	_, dlq := direct.StreamNames(q)
	if msg := err.Error(); !strings.Contains(msg, "stays, not deleted") || !strings.Contains(msg, dlq) {
		t.Errorf("DeadLetter's error %q does not say that its dead letter in %s stays", msg, dlq)
	}
	if out := logs.String(); !strings.Contains(out, "could not be deleted") || !strings.Contains(out, "id="+first.Message().ID) {
		t.Errorf("not logged with the message's ID: %q", out)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 1 {
		t.Errorf("dead-letter stream holds %d messages; want the copy that could not be deleted", n)
	}
}

// TestDeadLetterStoredAgainStaysDeduplicated: after a DeadLetter took its
// copy back (its lease ran out), the next holder's copy, dropped as a
// duplicate of the one gone, is stored again under another ID. When that
// holder's ack of the original is then lost (its connection stalls past
// the lease: the copy stays, as the package doc says), the holder after it
// must find that copy, as the dead letter already stored, and store no
// second one: two dead letters of one job, and a redrive of both would run
// it twice. Before, the copy stored again had an ID of its delivery (its
// NumDelivered), which every later delivery changed: each stored one more.
func TestDeadLetterStoredAgainStaysDeduplicated(t *testing.T) {
	const ackWait = 2 * time.Second
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
	ctx, p, direct, b, q, first := proxiedDelivery(t, opts, "dlagain")
	id := first.Message().ID

	// The first holder's lease runs out once its copy is stored: it takes
	// the copy back.
	restore := jetstream.SetDeadLetterHook(func() { time.Sleep(ackWait) })
	err := first.DeadLetter(ctx, errors.New("one"))
	restore()
	if !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("first DeadLetter = %v, want ErrLeaseLost", err)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 0 {
		t.Fatalf("dead-letter stream holds %d messages after the copy was taken back, want 0", n)
	}

	// The second holder's copy is stored again; then its connection
	// stalls, and its ack goes unanswered past its lease.
	var second sdk.Delivery
	for second == nil {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatalf("second Receive: %v", err)
		}
		if len(ds) > 0 {
			second = ds[0]
		}
	}
	stored := make(chan struct{})
	restore = jetstream.SetDeadLetterHook(func() {
		p.Freeze()
		close(stored)
	})
	defer restore()
	answered := make(chan error, 1)
	go func() { answered <- second.DeadLetter(ctx, errors.New("two")) }()
	select {
	case <-stored:
	case err := <-answered:
		t.Fatalf("second DeadLetter returned %v before storing its copy", err)
	}
	var third sdk.Delivery
	for third == nil && ctx.Err() == nil {
		ds, err := direct.Receive(ctx, q, 1)
		if err != nil {
			p.Thaw()
			t.Fatalf("third Receive: %v", err)
		}
		if len(ds) > 0 {
			third = ds[0]
		}
	}
	p.Thaw()
	t.Logf("second DeadLetter: %v", <-answered)
	restore()
	if third == nil || third.Message().ID != id {
		t.Fatalf("redelivered %v, want %q", third, id)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 1 {
		t.Fatalf("dead-letter stream holds %d messages after the second holder's copy, want 1", n)
	}

	if err := third.DeadLetter(ctx, errors.New("three")); err != nil {
		t.Fatalf("third DeadLetter: %v", err)
	}
	if n := dlqMsgs(ctx, t, direct, q); n != 1 {
		t.Errorf("dead-letter stream holds %d messages after the third holder's DeadLetter; want 1 (the job dead-lettered once)", n)
	}
}
