package sqs_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// A redrive by ID whose letter another reader held when the scan's first
// receive found nothing, and which the scan found once it was released and
// redrove, reported a *ScanError counting it as held elsewhere: the count
// read at that empty receive was kept after the scan found what it wanted.
// The CLI and dashboard then said the scan stopped early (exit 4).
func TestRedriveByIDOfLetterHeldElsewhereAtFirst(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 20*time.Second, 10000) // outlasts the other reader's hold
	q := declare(t, b, "redriveheldid", false, sqs.QueueConfig{})
	id := sdk.NewID()
	if err := b.Publish(testCtx(t), q+"-dlq", &sdk.Message{ID: id, Type: "dl", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	holdElsewhere(t, b, q, 0, 3*time.Second) // the one letter; lapses within the scan's wait
	n, err := b.RedriveDeadLetters(testCtx(t), q, id)
	if n != 1 || err != nil {
		t.Fatalf("RedriveDeadLetters(%s) = %d, %v; want 1, nil", id, n, err)
	}
	if left, err := b.ListDeadLetters(testCtx(t), q, 10); err != nil || len(left) != 0 {
		t.Fatalf("after the redrive: %d dead letters, %v; want none", len(left), err)
	}
}

// With no other reader, the dead letters a whole scan deleted itself are
// not counted as held elsewhere: a redrive or purge of all of them, and a
// Get or Delete of an ID that is not there, end at once with their result.
// The hold is made far longer than the test's deadline, so that a scan
// waiting for letters the counters still showed would fail it.
func TestWholeScanWithNoOtherReaderDoesNotWait(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 10*time.Minute, 10000)
	q := declare(t, b, "wholenowait", false, sqs.QueueConfig{})
	publish := func(n int) {
		t.Helper()
		msgs := make([]*sdk.Message, n)
		for i := range msgs {
			msgs[i] = &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("x")}
		}
		if err := b.Publish(testCtx(t), q+"-dlq", msgs...); err != nil {
			t.Fatal(err)
		}
	}
	publish(50)
	if n, err := b.RedriveDeadLetters(testCtx(t), q); n != 50 || err != nil {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 50, nil", n, err)
	}
	if _, err := b.GetDeadLetter(testCtx(t), q, "absent"); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("GetDeadLetter(absent) after the redrive = %v; want ErrNotFound", err)
	}
	publish(50)
	if _, err := b.DeleteDeadLetters(testCtx(t), q, "absent"); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("DeleteDeadLetters(absent) = %v; want ErrNotFound", err)
	}
	if n, err := b.PurgeDeadLetters(testCtx(t), q); n != 50 || err != nil {
		t.Fatalf("PurgeDeadLetters = %d, %v; want 50, nil", n, err)
	}
}

// A whole scan waits up to a hold for letters held elsewhere from the last
// time it found nothing new, not from the first: a wait at an early end
// (one letter held for a moment) used up the wait for the last end, so a
// letter released within a hold of that end was reported as remaining.
func TestWholeScanWaitStartsAgainAfterProgress(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 10*time.Second, 10000)
	q := declare(t, b, "waitagain", false, sqs.QueueConfig{})
	holdElsewhere(t, b, q, 2, 6*time.Second)  // released within the first wait
	holdElsewhere(t, b, q, 0, 13*time.Second) // past a hold from the first end, within one from the second
	n, err := b.RedriveDeadLetters(testCtx(t), q)
	if n != 2 || err != nil {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 2, nil", n, err)
	}
}
