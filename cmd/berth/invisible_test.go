package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// invisible are characters that print as nothing (or as a line break) and
// that no escape of control characters catches: a zero-width space, a word
// joiner, a BOM, a soft hyphen, tag characters (which spell hidden ASCII
// text), a Hangul filler and the line separator.
const invisible = "\u200b\u2060\ufeff\u00ad\U000e0041\U000e0042\u3164\u2028"

func hasInvisible(s string) bool { return strings.ContainsAny(s, invisible) }

// invisibleLetter dead-letters on b one message whose ID looks like "job-1"
// and whose type and reason hide text, as a producer outside berth (a raw
// AMQP publish, a SQS SendMessage) can send; it returns the ID.
func invisibleLetter(t *testing.T, b *memory.Broker) string {
	t.Helper()
	ctx := context.Background()
	m := &sdk.Message{ID: "job-1\u200b", Type: "billing.charge\U000e0041\U000e0042", Body: []byte("pay\u2060 now\u2028ok")}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("card\ufeff declined\u00ad\u3164"))); err != nil {
		t.Fatal(err)
	}
	return m.ID
}

// Text from a message that would not show on the terminal is printed as
// escapes, in text and -json output alike: an ID with a zero-width space
// looks like another ID, and tag characters carry text the operator cannot
// see. Before, only control characters and bidi overrides were escaped.
func TestInvisibleCharactersEscaped(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	id := invisibleLetter(t, b)

	for _, args := range [][]string{{"dlq", "list", "billing"}, {"dlq", "show", "billing", id}, {"dlq", "redrive", "billing", "-dry-run"}} {
		r := berth(t, b, args...)
		if r.code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.err)
		}
		if hasInvisible(r.out) || hasInvisible(r.err) {
			t.Errorf("%v: invisible characters printed raw:\n%q", args, r.out)
		}
		if !strings.Contains(r.out, `job-1\u200b`) {
			t.Errorf("%v: the ID's zero-width space is not shown as an escape:\n%s", args, r.out)
		}
	}

	r := berth(t, b, "dlq", "show", "billing", id, "-json")
	if r.code != exitOK {
		t.Fatalf("show -json: exit %d: %s", r.code, r.err)
	}
	if hasInvisible(r.out) {
		t.Errorf("show -json: invisible characters written raw:\n%q", r.out)
	}
	var m struct {
		ID, Type, Body string
		DeadLetter     struct{ Reason string } `json:"dead_letter"`
	}
	if err := json.Unmarshal([]byte(r.out), &m); err != nil {
		t.Fatalf("show -json: %v: %s", err, r.out)
	}
	// The escapes are the same JSON values: the exact ID, to redrive by.
	if m.ID != id || m.Type != "billing.charge\U000e0041\U000e0042" || m.Body != "pay\u2060 now\u2028ok" ||
		!strings.Contains(m.DeadLetter.Reason, "card\ufeff declined\u00ad\u3164") {
		t.Errorf("show -json decodes to %+q, not the message", m)
	}
}

// An argument that starts with "-" is read as a flag, and the flag package
// names an unknown one as it is: an ID taken from a message (a script's
// "berth dlq show billing $id") must not reach the terminal with its escape
// sequences.
func TestBadFlagNameEscaped(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, arg := range []string{"-\x1b]0;owned\x07x", "--\x1b[2Jx", "-\u202ex=1"} {
		r := berth(t, b, "dlq", "show", "billing", arg)
		if r.code != exitUsage {
			t.Errorf("%q: exit %d, want %d", arg, r.code, exitUsage)
		}
		if strings.ContainsAny(r.err, "\x1b\x07\u202e") {
			t.Errorf("%q: the error prints it raw: %q", arg, r.err)
		}
		if !strings.Contains(r.err, "flag provided but not defined") {
			t.Errorf("%q: %q does not say the flag is unknown", arg, r.err)
		}
	}
}
