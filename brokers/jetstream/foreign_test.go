package jetstream_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// receiveOne receives from q until a delivery comes.
func receiveOne(ctx context.Context, t *testing.T, b *jetstream.Broker, q string) sdk.Delivery {
	t.Helper()
	for {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			return ds[0]
		}
	}
}

// wantRawHeaders checks that msg carries a foreign message's headers as
// they were published: several values, bytes that are not UTF-8.
func wantRawHeaders(t *testing.T, what string, h nats.Header) {
	t.Helper()
	if got := h["X-Multi"]; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("%s: X-Multi = %q, want [a b]", what, got)
	}
	if got := h["X-Bin"]; !slices.Equal(got, []string{"\xff\xfe"}) {
		t.Errorf("%s: X-Bin = %q, want [\"\\xff\\xfe\"]", what, got)
	}
}

// publishRaw publishes body with h on q's subject as a producer outside
// berth would, on a connection of its own that the test closes at its end.
func publishRaw(t *testing.T, b *jetstream.Broker, q string, h nats.Header, body string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(integration.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	m := nats.NewMsg(b.Subject(q))
	for k, vs := range h {
		m.Header[k] = vs
	}
	m.Data = []byte(body)
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	return nc
}

// rawJetStream returns a JetStream client on a connection of its own,
// closed at the test's end, to put messages where berth would not.
// storedSeqID is the "<stream>:<seq>:<stored>" ID of message seq of stream.
func storedSeqID(ctx context.Context, t *testing.T, js njs.JetStream, stream string, seq uint64) string {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	return jetstream.SeqID(stream, seq, raw.Time)
}

func rawJetStream(t *testing.T) njs.JetStream {
	t.Helper()
	nc, err := nats.Connect(integration.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// firstDeadLetterHeader returns the NATS headers of the first message
// stored in q's dead-letter stream, as the server holds them.
func firstDeadLetterHeader(ctx context.Context, t *testing.T, js njs.JetStream, b *jetstream.Broker, q string) nats.Header {
	t.Helper()
	_, dlq := b.StreamNames(q)
	ds, err := js.Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ds.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return raw.Header
}

// A message from another producer keeps its headers, every value and byte,
// in every copy berth stores of it: a Release, a dead letter, a redrive.
// They were rebuilt from the decoded message, so a second value was dropped
// and bytes that are not UTF-8 came back as U+FFFD.
func TestForeignHeadersKeptByCopies(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "foreignhdr")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	nc := publishRaw(t, b, q, nats.Header{nats.MsgIdHdr: {"order-9"}, "X-Multi": {"a", "b"}, "X-Bin": {"\xff\xfe"}}, "raw")
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	d := receiveOne(ctx, t, b, q)
	if err := d.(sdk.Releaser).Release(ctx, 0); err != nil {
		t.Fatal(err)
	}
	d = receiveOne(ctx, t, b, q)
	if got := d.Message().Header("X-Bin"); got != "\xff\xfe" {
		t.Errorf("after Release: X-Bin = %q", got)
	}
	if err := d.DeadLetter(ctx, sdk.Permanent(context.Canceled)); err != nil {
		t.Fatal(err)
	}

	wantRawHeaders(t, "dead letter", firstDeadLetterHeader(ctx, t, js, b, q))
	dl, err := b.GetDeadLetter(ctx, q, "order-9")
	if err != nil {
		t.Fatal(err)
	}
	if dl.Header("X-Bin") != "\xff\xfe" || dl.Header(sdk.HeaderDeadLetterQueue) != q {
		t.Errorf("GetDeadLetter headers = %q", dl.Headers)
	}

	if n, err := b.RedriveDeadLetters(ctx, q, "order-9"); n != 1 || err != nil {
		t.Fatalf("RedriveDeadLetters = %d, %v", n, err)
	}
	stream, _ := b.StreamNames(q)
	qs, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := qs.GetLastMsgForSubject(ctx, b.Subject(q))
	if err != nil {
		t.Fatal(err)
	}
	wantRawHeaders(t, "redriven copy", raw.Header)
	d = receiveOne(ctx, t, b, q)
	if h := d.Message().Headers; h["X-Bin"] != "\xff\xfe" || h["X-Multi"] != "a" || h[sdk.HeaderRedriveCount] != "1" || h[sdk.HeaderDeadLetterReason] != "" {
		t.Errorf("redriven message headers = %q", h)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// A message whose Berth-Message header does not decode is dead-lettered
// with its other headers; they were dropped.
func TestUndecodableDeadLetterKeepsHeaders(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "undecodable")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	nc := publishRaw(t, b, q, nats.Header{"Berth-Message": {"{not json"}, "X-Multi": {"a", "b"}, "X-Bin": {"\xff\xfe"}}, "raw")
	var dls []*sdk.Message
	var err error
	for len(dls) == 0 && ctx.Err() == nil {
		if ds, err := b.Receive(ctx, q, 1); err != nil || len(ds) != 0 {
			t.Fatalf("Receive = %v, %v; want the message dead-lettered", ds, err)
		}
		if dls, err = b.ListDeadLetters(ctx, q, 10); err != nil {
			t.Fatal(err)
		}
	}
	if len(dls) != 1 {
		t.Fatalf("dead letters = %v", dls)
	}
	h := dls[0].Headers
	if h["X-Bin"] != "\xff\xfe" || h["X-Multi"] != "a" || h[sdk.HeaderDeadLetterClass] != string(sdk.ClassPermanent) || string(dls[0].Body) != "raw" {
		t.Errorf("dead letter = %q headers %q", dls[0].Body, h)
	}
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	wantRawHeaders(t, "dead letter", firstDeadLetterHeader(ctx, t, js, b, q))
}

// A message from another producer whose Nats-Msg-Id is not UTF-8 gets the
// stream:sequence ID, and its dead letter is found and redriven by the ID it
// is shown with. The raw ID was used: the dead letter's envelope (JSON)
// showed it with U+FFFD, under which neither GetDeadLetter nor a redrive by
// ID found it (it was stored under the raw ID's subject token).
func TestForeignInvalidUTF8MsgIDDeadLetterFound(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "foreignid")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	publishRaw(t, b, q, nats.Header{nats.MsgIdHdr: {"order-\xff"}}, "raw")
	d := receiveOne(ctx, t, b, q)
	id := d.Message().ID
	if err := d.DeadLetter(ctx, sdk.Permanent(context.Canceled)); err != nil {
		t.Fatal(err)
	}
	dls, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("ListDeadLetters = %v, %v", dls, err)
	}
	if dls[0].ID != id {
		t.Errorf("dead letter ID %q, delivered as %q", dls[0].ID, id)
	}
	if _, err := b.GetDeadLetter(ctx, q, dls[0].ID); err != nil {
		t.Errorf("GetDeadLetter(%q): %v", dls[0].ID, err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q, dls[0].ID); n != 1 || err != nil {
		t.Fatalf("RedriveDeadLetters(%q) = %d, %v", dls[0].ID, n, err)
	}
	d = receiveOne(ctx, t, b, q)
	if d.Message().ID != id || string(d.Message().Body) != "raw" {
		t.Errorf("redriven %q %q", d.Message().ID, d.Message().Body)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// A foreign dead letter is listed as "<dead-letter stream>:<sequence>", and
// a berth message may carry that very ID (any UTF-8 string is a message
// ID; a foreign letter redriven and dead-lettered again does, while the
// original stays when the redrive failed half way). Every letter listed
// under an ID is reached by it. Before, the berth letter hid the foreign
// one: Get returned it, and a delete or redrive by the ID acted on it
// alone, leaving the foreign letter out of reach of every action by ID.
func TestForeignSeqIDSharedWithBerthLetter(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "seqidclash")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js := rawJetStream(t)
	// Not on the subject of an ID: listed as a foreign letter.
	pa, err := js.Publish(ctx, b.DeadSubject(q)+".nobody", []byte("foreign"))
	if err != nil {
		t.Fatal(err)
	}
	_, dlq := b.StreamNames(q)
	id := storedSeqID(ctx, t, js, dlq, pa.Sequence)
	if err := b.Publish(ctx, q, &sdk.Message{ID: id, Body: []byte("berth")}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(ctx, t, b, q)
	if err := d.DeadLetter(ctx, sdk.Permanent(context.Canceled)); err != nil {
		t.Fatal(err)
	}
	dls, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(dls) != 2 || dls[0].ID != id || dls[1].ID != id {
		t.Fatalf("ListDeadLetters = %v, %v; want the foreign letter and the berth one, both %q", dls, err, id)
	}
	if m, err := b.GetDeadLetter(ctx, q, id); err != nil || string(m.Body) != "berth" {
		t.Errorf("GetDeadLetter(%q) = %v, %v; want the latest, the berth letter", id, m, err)
	}
	// What a change of the ID is confirmed with: every letter it moves.
	if n, err := b.CountDeadLetters(ctx, q, id); n != 2 || err != nil {
		t.Errorf("CountDeadLetters(%q) = %d, %v; want both letters listed under it", id, n, err)
	}
	if n, err := b.DeleteDeadLetters(ctx, q, id); n != 2 || err != nil {
		t.Errorf("DeleteDeadLetters(%q) = %d, %v; want both letters listed under it", id, n, err)
	}
	if dls, err := b.ListDeadLetters(ctx, q, 10); err != nil || len(dls) != 0 {
		t.Errorf("left after the delete: %v, %v", dls, err)
	}
	if n, err := b.CountDeadLetters(ctx, q, id); n != 0 || err != nil {
		t.Errorf("CountDeadLetters(%q) after the delete = %d, %v; want 0", id, n, err)
	}
}
