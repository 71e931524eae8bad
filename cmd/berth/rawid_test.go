package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// TestListJSONNonUTF8ID: RabbitMQ takes raw messages from any producer, and
// an AMQP message-id is bytes: a job whose ID is not UTF-8 is consumed and
// dead-lettered like any other. dlq list -json must give the operator the
// ID's exact bytes, so that dlq redrive can address the letter. Before,
// encoding/json replaced the invalid bytes with U+FFFD: the printed ID was
// not the letter's, and a redrive by it found nothing.
func TestListJSONNonUTF8ID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, u, queue := rabbitQueue(t, ctx, "berth-cli-test")
	// Another producer, straight to the queue.
	const rawID = "job-\xff\xfe-1"
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
		MessageId: rawID, Type: "billing.charge", DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
	}); err != nil {
		t.Fatal(err)
	}
	var d sdk.Delivery
	for d == nil {
		ds, err := b.Receive(ctx, queue, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 1 {
			d = ds[0]
		}
	}
	if got := d.Message().ID; got != rawID {
		t.Fatalf("received ID %q, want %q", got, rawID)
	}
	if err := d.DeadLetter(ctx, sdk.Permanent(fmt.Errorf("declined"))); err != nil {
		t.Fatal(err)
	}
	b.Close() // its consumer would take the redriven message

	var r result
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = cliOn(t, u, "-json", "dlq", "list", queue)
		if r.code == 0 || time.Now().After(deadline) {
			break
		}
	}
	var l struct {
		Messages []map[string]any `json:"messages"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.out), &l) != nil || len(l.Messages) != 1 {
		t.Fatalf("list -json (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// The ID as the JSON gives it: id, or its exact bytes in id_base64
	// when it is not UTF-8 (as body and body_encoding do for the body).
	id, _ := l.Messages[0]["id"].(string)
	if s, ok := l.Messages[0]["id_base64"].(string); ok {
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatalf("id_base64 %q: %v", s, err)
		}
		id = string(raw)
	}
	if id != rawID {
		t.Errorf("list -json gives the ID as %q, the letter's is %q:\n%s", id, rawID, r.out)
	}
	if r := cliOn(t, u, "dlq", "redrive", queue, id, "-yes"); r.code != 0 || !strings.Contains(r.out, "redriven 1 ") {
		t.Fatalf("redrive by the ID list -json printed (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}

// TestFailuresJSONNonUTF8ID: a dead letter that could not be changed is
// listed in -json with its ID's exact bytes too, when they are not UTF-8,
// so that the operator can retry it by that ID.
func TestFailuresJSONNonUTF8ID(t *testing.T) {
	const rawID = "job-\xff\xfe-1"
	fs := failures([]dlq.Failure{{ID: rawID, Err: errors.New("gone")}, {ID: "plain", Err: errors.New("gone")}})
	if got, err := base64.StdEncoding.DecodeString(fs[0].IDBase64); err != nil || string(got) != rawID {
		t.Errorf("id_base64 %q (%v) of a non-UTF-8 ID, want its bytes %q", fs[0].IDBase64, err, rawID)
	}
	if fs[1].IDBase64 != "" {
		t.Errorf("id_base64 %q of a UTF-8 ID, want none", fs[1].IDBase64)
	}
}
