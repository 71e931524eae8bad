package sqs_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// A FIFO dead-letter queue with more dead letters in one message group than
// a receive returns (SQS: up to 10; fauxqs: 1): SQS returns no more letters
// of a group while earlier ones are in flight, so a whole scan that holds
// the first ones cannot see the rest. Get and redrive by ID of the 12th
// waited a hold (30 s) for them, then blamed "another reader" that held them
// "for 30s". They now end at once with a *ScanError that says the letters
// are queued behind the scan's own in their group, and that it did not
// wait. The hold is made far longer than the test's deadline, so that a scan
// that waits fails the test with its context's error.
func TestFIFOScanBlockedByItsOwnHoldEndsAtOnce(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	hold := 10 * time.Minute
	sqs.SetScanLimits(b, hold, 10000)
	q := declare(t, b, "fifoblocked", true, sqs.QueueConfig{})
	dlq := strings.TrimSuffix(q, ".fifo") + "-dlq.fifo"
	ctx := testCtx(t)
	msgs := make([]*sdk.Message, 12)
	for i := range msgs {
		msgs[i] = &sdk.Message{ID: sdk.NewID(), Type: "dl", Key: "one-group", Body: []byte("x")}
	}
	if err := b.Publish(ctx, dlq, msgs...); err != nil {
		t.Fatal(err)
	}
	last := msgs[len(msgs)-1].ID
	check := func(call string, err error) {
		t.Helper()
		var se *sqs.ScanError
		if !errors.As(err, &se) || errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("%s = %v; want a *ScanError", call, err)
		}
		t.Logf("%s: %v", call, err)
		if se.Remaining < 2 || se.Remaining > 11 { // those behind the ones held
			t.Errorf("%s: Remaining %d, want 2 to 11 (the letters behind those the scan held)", call, se.Remaining)
		}
		for _, wrong := range []string{"another reader", hold.String()} {
			if strings.Contains(se.Reason, wrong) {
				t.Errorf("%s: reason %q says %q: the scan blocked its own group and did not wait", call, se.Reason, wrong)
			}
		}
		for _, want := range []string{"FIFO message groups", "did not wait"} {
			if !strings.Contains(se.Reason, want) {
				t.Errorf("%s: reason %q lacks %q", call, se.Reason, want)
			}
		}
	}
	_, err := b.GetDeadLetter(ctx, q, last)
	check("GetDeadLetter(the 12th)", err)
	n, err := b.RedriveDeadLetters(ctx, q, last)
	if n != 0 {
		t.Errorf("RedriveDeadLetters(the 12th) redrove %d, want 0", n)
	}
	check("RedriveDeadLetters(the 12th)", err)
	_, err = b.DeleteDeadLetters(ctx, q, last)
	check("DeleteDeadLetters(the 12th)", err)
	// Nothing was lost, and a redrive of all, which deletes what it
	// redrives and so unlocks the group, reaches every letter.
	if st, err := b.Stats(ctx, q); err != nil || st.DeadLettered != 12 {
		t.Fatalf("Stats: %d dead letters, %v; want 12", st.DeadLettered, err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); n != 12 || err != nil {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 12, nil", n, err)
	}
}

// A whole scan that waited for a letter held elsewhere says how long it
// waited, not that the letters were held "for" the hold.
func TestScanErrorSaysHowLongItWaited(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 2*time.Second, 10000)
	q := declare(t, b, "waitedtext", false, sqs.QueueConfig{})
	release := holdElsewhere(t, b, q, 1, time.Minute)
	defer release()
	_, err := b.GetDeadLetter(testCtx(t), q, "absent")
	var se *sqs.ScanError
	if !errors.As(err, &se) || se.Remaining != 1 {
		t.Fatalf("GetDeadLetter(absent) = %v; want a *ScanError with 1 remaining", err)
	}
	if !strings.Contains(se.Reason, "waited") || !strings.Contains(se.Reason, "(up to 2s)") {
		t.Errorf("reason %q does not say how long the scan waited, and for up to what", se.Reason)
	}
}
