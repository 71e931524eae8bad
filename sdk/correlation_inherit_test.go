package sdk_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// A handler's follow-up publish inherits the delivery's correlation ID, which
// a foreign producer may have sent as raw bytes (AMQP correlation-id). The
// handler did not choose it: Prepare replaces it with valid text instead of
// passing bytes that PostgreSQL refuses and SQS rewrites. The follow-ups of
// one flow still share one ID, distinct flows keep distinct ones (binary
// IDs made of invalid bytes only must not merge), and the ID stays short.
func TestInheritedCorrelationIDMadeValid(t *testing.T) {
	prepared := func(raw string) string {
		t.Helper()
		m := &sdk.Message{Type: "follow.up", Body: []byte("{}")}
		if err := sdk.Prepare(sdk.WithCorrelationID(context.Background(), raw), "q", m, 0); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		if !utf8.ValidString(m.CorrelationID) {
			t.Fatalf("CorrelationID %q is not valid UTF-8", m.CorrelationID)
		}
		return m.CorrelationID
	}
	a1, a2 := prepared("flow-\xff\xfe-1"), prepared("flow-\xff\xfe-1")
	if a1 != a2 {
		t.Errorf("one flow's follow-ups got %q and %q", a1, a2)
	}
	if b := prepared("flow-\xfe\xff-1"); b == a1 {
		t.Errorf("two flows merged into %q", b)
	}
	if x, y := prepared("\x80\x81\x82\x83"), prepared("\x90\x91\x92\x93"); x == y {
		t.Errorf("two binary IDs merged into %q", x)
	}
	if long := prepared(strings.Repeat("a\xff", 127)); len(long) > 255 {
		t.Errorf("a 254-byte ID became %d bytes, over RabbitMQ's 255", len(long))
	}
	if ok := prepared("flow-\u00e9-1"); ok != "flow-\u00e9-1" {
		t.Errorf("a valid ID was changed to %q", ok)
	}

	// Through a broker's Publish, as a handler does.
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := &sdk.Message{Type: "follow.up", Body: []byte("{}")}
	if err := b.Publish(sdk.WithCorrelationID(context.Background(), "flow-\xff\xfe-1"), "q", m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if m.CorrelationID != a1 {
		t.Errorf("published CorrelationID %q, want %q as Prepare gives", m.CorrelationID, a1)
	}

	// A CorrelationID the caller set itself is still refused.
	bad := &sdk.Message{Type: "t", CorrelationID: "x\xff"}
	if err := sdk.Prepare(context.Background(), "q", bad, 0); err == nil {
		t.Error("Prepare accepted an invalid CorrelationID set on the message")
	}
}
