package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// maxSizeBroker returns a broker whose MaxMessageSize is the server's
// max_payload (so that only the NATS size check limits a Publish) and a
// queue of it.
func maxSizeBroker(t *testing.T, prefix string) (*jetstream.Broker, string) {
	t.Helper()
	probe := newBroker(t, testOpts)
	opts := testOpts
	opts.MaxMessageSize = int(probe.Conn().MaxPayload())
	b := newBroker(t, opts)
	return b, declare(t, b, prefix)
}

// publishLargest publishes, with id, the message with the largest body
// Publish accepts on q, and returns it. Larger ones must be refused with a
// MessageTooLargeError.
func publishLargest(ctx context.Context, t *testing.T, b *jetstream.Broker, q, id string) *sdk.Message {
	t.Helper()
	limit := int(b.Conn().MaxPayload())
	body := make([]byte, limit)
	for i := range body {
		body[i] = byte(i*7 + i>>8)
	}
	for n := limit; n > limit-4096; n-- {
		m := &sdk.Message{ID: id, Type: "large", Body: body[:n]}
		err := b.Publish(ctx, q, m)
		if err == nil {
			return m
		}
		if !errors.Is(err, sdk.ErrMessageTooLarge) {
			t.Fatalf("Publish of a %d-byte body: %v, want nil or ErrMessageTooLarge", n, err)
		}
	}
	t.Fatal("no body within 4 KiB of max_payload was accepted")
	return nil
}

// wantLargeDeadLetter checks that q's only dead letter is m, body and
// identity exact, marked as truncated.
func wantLargeDeadLetter(ctx context.Context, t *testing.T, b *jetstream.Broker, q string, m *sdk.Message) {
	t.Helper()
	dls, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if dl.ID != m.ID || dl.Type != m.Type || !bytes.Equal(dl.Body, m.Body) {
		t.Fatalf("dead letter %s (type %q, %d-byte body), want %s (type %q) with its %d-byte body intact",
			dl.ID, dl.Type, len(dl.Body), m.ID, m.Type, len(m.Body))
	}
	t.Logf("%s: %s = %q, reason %q", dl.ID, jetstream.HeaderDeadLetterTruncated, dl.Header(jetstream.HeaderDeadLetterTruncated), dl.Header(sdk.HeaderDeadLetterReason))
	if dl.Header(jetstream.HeaderDeadLetterTruncated) == "" {
		t.Errorf("dead letter of a message at the size limit not marked %s: headers %v", jetstream.HeaderDeadLetterTruncated, dl.Headers)
	}
}

// A message as large as Publish accepts is dead-lettered by the poison
// check when it runs out of deliveries. Its dead-letter copy, with berth's
// annotations, was over the server's max_payload: the publish of the copy
// failed, the message was neither dead-lettered nor acked, and every
// Receive after its AckWait tried again, for ever.
func TestPoisonMessageAtSizeLimitIsDeadLettered(t *testing.T) {
	b, q := maxSizeBroker(t, "poisonlarge")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	m := publishLargest(ctx, t, b, q, "poison-large")
	for i := 1; i <= testMaxDeliveries; i++ {
		d := receiveOne(ctx, t, b, q)
		if d.Message().ID != m.ID || d.Attempt() != i {
			t.Fatalf("delivery %s attempt %d, want %s attempt %d", d.Message().ID, d.Attempt(), m.ID, i)
		}
		if err := d.Retry(ctx, 0, errors.New("fails")); err != nil {
			t.Fatal(err)
		}
	}
	// The next delivery is over MaxDeliveries: Receive dead-letters it.
	deadline := time.Now().Add(4 * testLease)
	for {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			t.Fatalf("Receive handed out %s attempt %d, over MaxDeliveries %d", ds[0].Message().ID, ds[0].Attempt(), testMaxDeliveries)
		}
		st, err := b.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.DeadLettered == 1 && st.Ready == 0 && st.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("poison message at the size limit not dead-lettered after %s: %+v (redelivered again and again)", 4*testLease, st)
		}
	}
	wantLargeDeadLetter(ctx, t, b, q, m)
}

// A handler's DeadLetter of a message as large as Publish accepts, with a
// long reason, stores it (the reason shortened, the message exact), and the
// dead letter can be redriven. It failed with NATS's "maximum payload
// exceeded", and the message came back after its AckWait.
func TestDeadLetterAtSizeLimitFits(t *testing.T) {
	b, q := maxSizeBroker(t, "dlqlarge")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	m := publishLargest(ctx, t, b, q, "dlq-large")
	d := receiveOne(ctx, t, b, q)
	cause := sdk.Permanent(errors.New("invalid: " + strings.Repeat("<bad field> ", 80)))
	reason := cause.Error()
	if err := d.DeadLetter(ctx, cause); err != nil {
		t.Fatalf("DeadLetter of a message at the size limit: %v", err)
	}
	wantLargeDeadLetter(ctx, t, b, q, m)
	dl, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := dl.Header(sdk.HeaderDeadLetterReason); got != "" && !strings.HasPrefix(reason, strings.TrimSuffix(got, "…")) {
		t.Errorf("reason %q is not a prefix of %q", got, reason)
	}

	if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
	}
	d = receiveOne(ctx, t, b, q)
	got := d.Message()
	if got.ID != m.ID || !bytes.Equal(got.Body, m.Body) {
		t.Fatalf("redriven %s with a %d-byte body, want %s with its body intact", got.ID, len(got.Body), m.ID)
	}
	for _, h := range []string{jetstream.HeaderDeadLetterTruncated, sdk.HeaderDeadLetterReason} {
		if v, ok := got.Headers[h]; ok {
			t.Errorf("redriven message keeps %s = %q", h, v)
		}
	}
	if got.Header(sdk.HeaderRedriveCount) != "1" {
		t.Errorf("%s = %q, want 1", sdk.HeaderRedriveCount, got.Header(sdk.HeaderRedriveCount))
	}
	// Once more, now with its redrive count: it still fits.
	if err := d.DeadLetter(ctx, cause); err != nil {
		t.Fatalf("DeadLetter of the redriven message: %v", err)
	}
	wantLargeDeadLetter(ctx, t, b, q, m)
	if _, err := b.PurgeDeadLetters(ctx, q); err != nil {
		t.Fatal(err)
	}

	// A message with room for its annotations but not for the whole
	// reason: only the reason is cut.
	m = &sdk.Message{ID: "dlq-reason", Type: "large", Body: m.Body[:len(m.Body)-600]}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, cause); err != nil {
		t.Fatalf("DeadLetter of a message near the size limit: %v", err)
	}
	wantLargeDeadLetter(ctx, t, b, q, m)
	if dl, err = b.GetDeadLetter(ctx, q, m.ID); err != nil {
		t.Fatal(err)
	}
	got2 := dl.Header(sdk.HeaderDeadLetterReason)
	if dl.Header(jetstream.HeaderDeadLetterTruncated) != "reason" || !strings.HasSuffix(got2, "…") ||
		!strings.HasPrefix(reason, strings.TrimSuffix(got2, "…")) || len(got2) < 100 {
		t.Errorf("truncated %q, reason %q: want the reason cut, a prefix of %q", dl.Header(jetstream.HeaderDeadLetterTruncated), got2, reason)
	}
	if dl.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPermanent) || dl.Header(sdk.HeaderDeadLetterQueue) != q {
		t.Errorf("annotations lost with only the reason too long: %v", dl.Headers)
	}
}

// A message on a dead-letter subject whose Berth-Message header does not
// decode (another producer's, or one published by hand) is listed, paged,
// got and deleted like any other dead letter, by the ID "<stream>:<seq>:<stored>",
// with its raw body and headers and a reason saying it is not berth's; the
// dead letters around it are listed too. Listing and paging failed for the
// whole queue with "undecodable Berth-Message header".
func TestMalformedDeadLetterIsListed(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "dlqmalformed")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	deadLetter := func(id string) {
		t.Helper()
		if err := b.Publish(ctx, q, &sdk.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, errors.New("bad")); err != nil {
			t.Fatal(err)
		}
	}
	deadLetter("before")

	js := rawJetStream(t)
	raw := nats.NewMsg(b.DeadSubject(q) + ".byhand")
	raw.Header.Set("Berth-Message", `{"v":1,"id":`)
	raw.Header.Set("X-Origin", "by hand")
	raw.Data = []byte("raw \xff bytes")
	pa, err := js.PublishMsg(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	_, dlqStream := b.StreamNames(q)
	badID := storedSeqID(ctx, t, js, dlqStream, pa.Sequence)

	deadLetter("after")

	var ids []string
	cursor := ""
	for {
		page, next, err := b.DeadLetterPage(ctx, q, cursor, 1)
		if err != nil {
			t.Fatalf("DeadLetterPage(%q): %v", cursor, err)
		}
		for _, m := range page {
			ids = append(ids, m.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if want := []string{"before", badID, "after"}; strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Fatalf("pages list %q, want %q", ids, want)
	}
	list, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(list) != 3 {
		t.Fatalf("ListDeadLetters: %d, %v; want 3", len(list), err)
	}
	bad := list[1]
	if bad.ID != badID || string(bad.Body) != string(raw.Data) || bad.Header("X-Origin") != "by hand" ||
		!strings.Contains(bad.Header(sdk.HeaderDeadLetterReason), "not a berth dead letter") {
		t.Fatalf("malformed dead letter listed as %s, body %q, headers %q", bad.ID, bad.Body, bad.Headers)
	}
	if got, err := b.GetDeadLetter(ctx, q, badID); err != nil || got.ID != badID {
		t.Fatalf("GetDeadLetter(%s) = %v, %v", badID, got, err)
	}
	if n, err := b.DeleteDeadLetters(ctx, q, badID); err != nil || n != 1 {
		t.Fatalf("DeleteDeadLetters(%s) = %d, %v; want 1", badID, n, err)
	}
	if _, err := b.GetDeadLetter(ctx, q, badID); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("GetDeadLetter of the deleted %s: %v, want ErrNotFound", badID, err)
	}
	if _, err := b.GetDeadLetter(ctx, q, storedSeqID(ctx, t, js, dlqStream, 1)); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("GetDeadLetter by the sequence of a berth dead letter: %v, want ErrNotFound", err)
	}
	list, err = b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(list) != 2 || list[0].ID != "before" || list[1].ID != "after" {
		t.Fatalf("after the delete: %d dead letters, %v; want before, after", len(list), err)
	}
}

// Every dead letter a listing shows can be got, deleted and redriven by the
// ID it is listed with, including one published onto a dead-letter subject
// by hand that berth can read but did not store there: a plain NATS message
// with a Nats-Msg-Id, and one with a well-formed Berth-Message header. Each
// was listed by its own ID, but looked up on that ID's subject, where it is
// not: get, delete and redrive by the listed ID were ErrNotFound, and only a
// purge or a redrive of all could reach it.
func TestHandPublishedDeadLetterIsAddressable(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "dlqbyhand")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js := rawJetStream(t)
	plain := nats.NewMsg(b.DeadSubject(q) + ".byhand")
	plain.Header.Set(nats.MsgIdHdr, "manual-1")
	plain.Data = []byte("plain")
	enveloped := nats.NewMsg(b.DeadSubject(q) + ".elsewhere")
	enveloped.Header.Set("Berth-Message", `{"v":1,"id":"manual-2"}`)
	enveloped.Data = []byte("enveloped")
	for _, m := range []*nats.Msg{plain, enveloped} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	list, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("ListDeadLetters: %d, %v; want 2", len(list), err)
	}
	for i, dl := range list {
		got, err := b.GetDeadLetter(ctx, q, dl.ID)
		if err != nil || !bytes.Equal(got.Body, dl.Body) {
			t.Fatalf("GetDeadLetter(%q), listed with body %q: %v, %v", dl.ID, dl.Body, got, err)
		}
		if i == 0 {
			if n, err := b.DeleteDeadLetters(ctx, q, dl.ID); err != nil || n != 1 {
				t.Fatalf("DeleteDeadLetters(%q) = %d, %v; want 1", dl.ID, n, err)
			}
		} else {
			if n, err := b.RedriveDeadLetters(ctx, q, dl.ID); err != nil || n != 1 {
				t.Fatalf("RedriveDeadLetters(%q) = %d, %v; want 1", dl.ID, n, err)
			}
			d := receiveOne(ctx, t, b, q)
			if string(d.Message().Body) != "enveloped" {
				t.Fatalf("redriven %s with body %q, want %q", d.Message().ID, d.Message().Body, "enveloped")
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if list, err := b.ListDeadLetters(ctx, q, 10); err != nil || len(list) != 0 {
		t.Fatalf("after delete and redrive: %d dead letters, %v; want none", len(list), err)
	}
}
