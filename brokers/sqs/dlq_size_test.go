package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// sizeLimit is the MaxWireSize (and MaxMessageSize) of the size tests: small,
// so that messages at the limit are quick to move.
const sizeLimit = 4096

// userHeaders returns the headers of a message at the size limit: the
// application's, which a dead letter must keep exactly.
func userHeaders() map[string]string {
	return map[string]string{"tenant": "acme", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-note": "ünïcode ✓"}
}

// largestAccepted returns the message with the largest text body Publish
// accepts on q (every larger one refused with a MessageTooLargeError before
// anything is sent), after publishing it.
func largestAccepted(ctx context.Context, t *testing.T, b *sqs.Broker, q string, fifo bool) *sdk.Message {
	t.Helper()
	body := bytes.Repeat([]byte("0123456789abcdef"), sizeLimit/16)
	for n := len(body); n > 0; n-- {
		m := &sdk.Message{ID: sdk.NewID(), Type: "large", IdempotencyKey: "large:" + suffix(), CorrelationID: "corr",
			Headers: userHeaders(), Body: body[:n]}
		if fifo {
			m.Key = "group-1"
		}
		err := b.Publish(ctx, q, m)
		if err == nil {
			return m
		}
		if !errors.Is(err, sdk.ErrMessageTooLarge) {
			t.Fatalf("Publish of a %d-byte body: %v, want nil or ErrMessageTooLarge", n, err)
		}
	}
	t.Fatal("no body was accepted")
	return nil
}

// wantDeadLetter checks that m's dead letter on q carries m exactly (ID,
// fields, body and the application's headers: the only headers not
// berth's), and returns it.
func wantDeadLetter(ctx context.Context, t *testing.T, b *sqs.Broker, q string, m *sdk.Message) *sdk.Message {
	t.Helper()
	dl, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatalf("GetDeadLetter(%s): %v", m.ID, err)
	}
	if dl.ID != m.ID || dl.Type != m.Type || dl.IdempotencyKey != m.IdempotencyKey || dl.Key != m.Key ||
		dl.CorrelationID != m.CorrelationID || !bytes.Equal(dl.Body, m.Body) {
		t.Fatalf("dead letter %s (type %q, %d-byte body), want %s (type %q) with its %d-byte body intact",
			dl.ID, dl.Type, len(dl.Body), m.ID, m.Type, len(m.Body))
	}
	user := maps.Clone(dl.Headers)
	maps.DeleteFunc(user, func(k, _ string) bool { return sdk.IsReservedHeader(k) })
	want := maps.Clone(m.Headers)
	maps.DeleteFunc(want, func(k, _ string) bool { return sdk.IsReservedHeader(k) })
	if !maps.Equal(user, want) {
		t.Fatalf("dead letter %s: application headers %q, want %q", m.ID, user, want)
	}
	t.Logf("%s: %s = %q, reason %q", dl.ID, sqs.HeaderDeadLetterTruncated,
		dl.Header(sqs.HeaderDeadLetterTruncated), dl.Header(sdk.HeaderDeadLetterReason))
	// berth's own dead letter, annotations shortened or not, is never
	// listed as one SQS's redrive policy moved.
	if dl.Header(sdk.HeaderDeadLetterClass) == string(sdk.ClassPoison) {
		t.Errorf("dead letter %s listed as moved by SQS's redrive policy: %q", m.ID, dl.Headers)
	}
	return dl
}

// TestDeadLetterAtWireLimit: every message Publish accepts can be
// dead-lettered with its body, fields and headers intact, however close to
// MaxWireSize it is and however long the reason: berth shortens its own
// annotations and marks the copy berth-dlq-truncated. A message within
// CopyReserve of the limit is refused at Publish with the typed error.
// Before, Publish accepted a message up to MaxWireSize exactly, and its
// dead-letter copy, annotations added, was over the limit: DeadLetter failed
// with a MessageTooLargeError, the message came back after its visibility
// timeout until SQS's redrive policy moved it without berth's reason.
func TestDeadLetterAtWireLimit(t *testing.T) {
	t.Parallel() // waits out a visibility timeout
	for _, fifo := range []bool{false, true} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := fastOptions()
			opts.MaxWireSize, opts.MaxMessageSize = sizeLimit, sizeLimit
			b := newBroker(t, opts)
			q := declare(t, b, "dlqsize", fifo, sqs.QueueConfig{}) // MaximumMessageSize sizeLimit, both queues
			ctx := testCtx(t)

			m := largestAccepted(ctx, t, b, q, fifo)
			if n := sqs.WireSize(m); n > sizeLimit-sqs.CopyReserve {
				t.Errorf("Publish accepted %s of %d bytes on the wire, within %d bytes of MaxWireSize %d",
					m.ID, n, sqs.CopyReserve, sizeLimit)
			}

			// The largest accepted message, dead-lettered with the longest
			// reason berth writes, escapes and all: the copy fits.
			cause := sdk.Permanent(errors.New("invalid: " + strings.Repeat("<bad> & \"field\" ✗ ", 80)))
			reason := sdk.SanitizeReason(cause.Error())
			d := receiveN(t, b, q, 1)[0]
			if d.Message().ID != m.ID {
				t.Fatalf("received %s, want %s", d.Message().ID, m.ID)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatalf("DeadLetter of a message Publish accepted at the size limit: %v", err)
			}
			expectNone(t, b, q, 1500*time.Millisecond) // deleted, not coming back
			dl := wantDeadLetter(ctx, t, b, q, m)
			if dl.Header(sqs.HeaderDeadLetterTruncated) == "" {
				t.Errorf("dead letter at the size limit not marked %s: headers %q", sqs.HeaderDeadLetterTruncated, dl.Headers)
			}
			if got := dl.Header(sdk.HeaderDeadLetterReason); got != "" && !strings.HasPrefix(reason, strings.TrimSuffix(got, "…")) {
				t.Errorf("reason %q is not a prefix of %q", got, reason)
			}

			// Redriven, it comes back exact, without berth's notes, and
			// dead-letters again with its redrive count.
			if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
				t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
			}
			d = receiveN(t, b, q, 1)[0]
			want := m.Clone()
			want.SetHeader(sdk.HeaderRedriveCount, "1")
			sameMessage(t, d.Message(), want)
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatalf("DeadLetter of the redriven message: %v", err)
			}
			wantDeadLetter(ctx, t, b, q, want)
			if _, err := b.PurgeDeadLetters(ctx, q); err != nil {
				t.Fatal(err)
			}

			// Room for the annotations but not for the whole reason: only
			// the reason is cut, and the letter is listed as berth's own
			// (its class and source queue), not as SQS's redrive.
			m = m.Clone()
			m.ID, m.IdempotencyKey = sdk.NewID(), "near:"+suffix() // a new FIFO deduplication ID
			m.Body = m.Body[:len(m.Body)-700]
			if err := b.Publish(ctx, q, m); err != nil {
				t.Fatal(err)
			}
			if err := receiveN(t, b, q, 1)[0].DeadLetter(ctx, cause); err != nil {
				t.Fatalf("DeadLetter of a message near the size limit: %v", err)
			}
			dl = wantDeadLetter(ctx, t, b, q, m)
			got := dl.Header(sdk.HeaderDeadLetterReason)
			if dl.Header(sqs.HeaderDeadLetterTruncated) != "reason" || !strings.HasSuffix(got, "…") ||
				!strings.HasPrefix(reason, strings.TrimSuffix(got, "…")) || len(got) < 100 {
				t.Errorf("truncated %q, reason %q: want the reason cut, a prefix of %q",
					dl.Header(sqs.HeaderDeadLetterTruncated), got, reason)
			}
			if dl.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPermanent) || dl.Header(sdk.HeaderDeadLetterQueue) != q {
				t.Errorf("annotations lost with only the reason too long: %q", dl.Headers)
			}

			// A message that SQS itself would take (exactly MaxWireSize) but
			// whose dead letter could not fit: refused, typed, nothing sent.
			tight := m.Clone()
			tight.ID, tight.IdempotencyKey = sdk.NewID(), "tight:"+suffix()
			tight.Body = bytes.Repeat([]byte("y"), len(tight.Body)+sizeLimit-sqs.WireSize(tight))
			if n := sqs.WireSize(tight); n != sizeLimit {
				t.Fatalf("test message of %d bytes on the wire, want %d", n, sizeLimit)
			}
			err := b.Publish(ctx, q, tight)
			var tooLarge *sdk.MessageTooLargeError
			if !errors.As(err, &tooLarge) || !errors.Is(err, sdk.ErrMessageTooLarge) {
				t.Fatalf("Publish of a message of MaxWireSize: %v, want *sdk.MessageTooLargeError", err)
			}
			if tooLarge.ID != tight.ID || tooLarge.Size != sizeLimit || tooLarge.Limit != sizeLimit-sqs.CopyReserve {
				t.Errorf("MessageTooLargeError %+v, want ID %s, Size %d, Limit %d", *tooLarge, tight.ID, sizeLimit, sizeLimit-sqs.CopyReserve)
			}
		})
	}
}
