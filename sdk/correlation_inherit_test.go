package sdk_test

import (
	"context"
	"testing"
	"unicode/utf8"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// A handler's follow-up publish inherits the delivery's correlation ID, which
// a foreign producer may have sent as raw bytes (AMQP correlation-id). The
// handler did not choose it: Prepare makes it valid text instead of passing
// bytes that PostgreSQL refuses and SQS rewrites, and the follow-ups of one
// flow still share one ID.
func TestInheritedCorrelationIDMadeValid(t *testing.T) {
	ctx := sdk.WithCorrelationID(context.Background(), "flow-\xff\xfe-1")
	var ids []string
	for range 2 {
		m := &sdk.Message{Type: "follow.up", Body: []byte("{}")}
		if err := sdk.Prepare(ctx, "q", m, 0); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		if !utf8.ValidString(m.CorrelationID) {
			t.Fatalf("CorrelationID %q is not valid UTF-8", m.CorrelationID)
		}
		ids = append(ids, m.CorrelationID)
	}
	if ids[0] != ids[1] || ids[0] != "flow-\uFFFD-1" {
		t.Errorf("correlation IDs %q: want both %q", ids, "flow-\uFFFD-1")
	}

	// Through a broker's Publish, as a handler does.
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := &sdk.Message{Type: "follow.up", Body: []byte("{}")}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if !utf8.ValidString(m.CorrelationID) {
		t.Errorf("published CorrelationID %q is not valid UTF-8", m.CorrelationID)
	}

	// A CorrelationID the caller set itself is still refused.
	bad := &sdk.Message{Type: "t", CorrelationID: "x\xff"}
	if err := sdk.Prepare(context.Background(), "q", bad, 0); err == nil {
		t.Error("Prepare accepted an invalid CorrelationID set on the message")
	}
}
