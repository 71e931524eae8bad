package sqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// idleAcker is an acker with no senders: every batch handed over waits, as
// when every sender is stuck on a slow SQS. It needs no client.
func idleAcker(t *testing.T) *acker {
	t.Helper()
	wrap := func(_ context.Context, _ string, err error) error { return err }
	return startAcker(nil, time.Hour, 30*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), wrap, 0)
}

// TestFlushRacingCloseFinishesItsDeletes: a Flush that took the buffered
// deletes and waits for a sender while Close gives up on the senders and
// stops them. The Flush's hand-over had no case for that: it waited out its
// own ctx (forever with context.Background), then put the deletes back in a
// buffer nobody sends any more, so a SyncAck Ack or DeadLetter waiting for
// one was never answered, and a failure nobody was told of: the message ran
// again. The Flush now finishes them (the broker closed) and returns
// ErrClosed at once.
func TestFlushRacingCloseFinishesItsDeletes(t *testing.T) {
	a := idleAcker(t)
	w := newAckWaiter()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	flushed := flushHolding(t, fctx, a, ackEntry{queue: "q", id: "m1", handle: "h1", w: w})
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	if err := a.close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close = %v, want its ctx's end (the delete is still held)", err)
	}
	expectClosed(t, flushed, "Flush racing Close", "Flush still waits for a sender after Close stopped them")
	done := make(chan error, 1)
	go func() { done <- w.wait(fctx) }()
	expectClosed(t, done, "the delete's waiter", "the delete's waiter was never answered")
}

// flushHolding adds e to a's queue "u" and starts a Flush under ctx, and
// returns once that Flush took it (and, with no sender free, holds it);
// the Flush's result arrives on the channel.
func flushHolding(t *testing.T, ctx context.Context, a *acker, e ackEntry) <-chan error {
	t.Helper()
	if err := a.add(context.Background(), "u", e); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- a.flush(ctx) }()
	for {
		a.mu.Lock()
		n := len(a.pending["u"])
		a.mu.Unlock()
		if n == 0 {
			return flushed
		}
		time.Sleep(time.Millisecond)
	}
}

// expectClosed waits for an error on c that wraps sdk.ErrClosed, failing t
// with hung when none comes: the wait guards against a hang, it times
// nothing (the answer comes at once when the code is right).
func expectClosed(t *testing.T, c <-chan error, what, hung string) {
	t.Helper()
	select {
	case err := <-c:
		if !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("%s got %v, want an error wrapping ErrClosed", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(hung)
	}
}

// TestRequeueAfterCloseFinishes: a batch put back (an Ack's or a Flush's
// ctx ended while it waited for a sender) after Close took the last of the
// buffer went to a buffer nobody sends any more: its deletes were never
// finished, so their waiters were never answered and their failure was
// neither logged nor counted. They are now finished with errClosedAcker.
func TestRequeueAfterCloseFinishes(t *testing.T) {
	a := idleAcker(t)
	if err := a.close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := newAckWaiter()
	a.requeue(ackBatch{url: "u", entries: []ackEntry{{queue: "q", id: "m1", handle: "h1", w: w}}})
	expectClosed(t, w.done, "the waiter", "a delete put back after Close was never finished")
}

// TestUncertainDeleteFailureLogsMaybe: a delete whose outcome is unknown
// (SQS's answer left it out, or was lost: sdk.ErrUnavailable) may have
// deleted the message; the warning said it "will be delivered again". It
// now says it may be; a refused delete still says it will.
func TestUncertainDeleteFailureLogsMaybe(t *testing.T) {
	a := idleAcker(t)
	var logs syncbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	a.finish(ackEntry{queue: "q", id: "m1"}, unanswered("this delete"))
	a.finish(ackEntry{queue: "q", id: "m2"}, &EntryError{Code: "AccessDenied", SenderFault: true})
	if err := a.close(context.Background()); err == nil {
		t.Error("close returned no error for the failed deletes")
	}
	var uncertain, refused string
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "message_id=m1"):
			uncertain = l
		case strings.Contains(l, "message_id=m2"):
			refused = l
		}
	}
	if !strings.Contains(uncertain, "may be delivered again") {
		t.Errorf("the warning of a delete whose outcome is unknown: %q, want it to say the message may be delivered again", uncertain)
	}
	if !strings.Contains(refused, "will be delivered again") {
		t.Errorf("the warning of a refused delete: %q, want it to say the message will be delivered again", refused)
	}
}

// TestCloseGivingUpSaysSo: a Close whose ctx ends before its buffered
// deletes reach a sender returns an error that says it gave up and how many
// deletes it did not send (still matching the ctx's error). Before, it
// returned the bare "context deadline exceeded", the deletes named only in
// the log.
func TestCloseGivingUpSaysSo(t *testing.T) {
	a := idleAcker(t)
	for _, id := range []string{"m1", "m2"} {
		if err := a.add(context.Background(), "u", ackEntry{queue: "q", id: id, handle: "h-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := a.close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close = %v, want its ctx's end", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "close gave up") || !strings.Contains(msg, "2 buffered deletes not sent") {
		t.Errorf("close = %q, want it to say it gave up and that 2 deletes were not sent", msg)
	}
}

// TestCloseGivingUpCountsHeldDeletes: a delete held by a Flush waiting for a
// sender when Close gives up is not sent either, and Close's count says so.
// Before, Close counted only what was left in its buffer: "0 buffered
// deletes not sent".
func TestCloseGivingUpCountsHeldDeletes(t *testing.T) {
	a := idleAcker(t)
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	flushed := flushHolding(t, fctx, a, ackEntry{queue: "q", id: "m1", handle: "h1"})
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	err := a.close(cctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 buffered deletes not sent") {
		t.Errorf("close = %v, want it to count the delete the Flush held", err)
	}
	<-flushed
}

// TestCloseWithTimedOutDeleteDoesNotSayItGaveUp: a delete call that timed
// out (its AckError wraps context.DeadlineExceeded) is a failed delete, not
// Close giving up, even when Close's own ctx has ended too. Before, Close
// then said it gave up, with "0 buffered deletes not sent".
func TestCloseWithTimedOutDeleteDoesNotSayItGaveUp(t *testing.T) {
	a := idleAcker(t)
	a.finish(ackEntry{queue: "q", id: "m1"}, context.DeadlineExceeded) // nobody waits: surfaced
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := a.close(ctx)
	var ae *AckError
	if !errors.As(err, &ae) || ae.ID != "m1" {
		t.Fatalf("close = %v, want the failed delete's AckError", err)
	}
	if strings.Contains(err.Error(), "gave up") {
		t.Errorf("close = %q, want no claim that it gave up: every delete was answered", err)
	}
}
