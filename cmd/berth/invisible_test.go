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

// A backslash in a message's text is printed as \\, so that the escapes the
// CLI prints cannot be forged: an ID spelt with the six characters \u200b
// no longer prints like one with a zero-width space. A JSON body is shown
// as JSON, its own escapes as they are. Before, the two IDs printed alike.
func TestBackslashEscaped(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	forged := &sdk.Message{ID: `job-1\u200b`, Type: `billing\charge`, Body: []byte(`{"path":"C:\\dir"}`)}
	if err := b.Publish(ctx, "billing", forged); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New(`bad \x1b`))); err != nil {
		t.Fatal(err)
	}
	invisibleLetter(t, b) // ID "job-1\u200b", with a real zero-width space

	r := berth(t, b, "dlq", "list", "billing")
	if r.code != exitOK || !strings.Contains(r.out, `job-1\\u200b `) || !strings.Contains(r.out, `job-1\u200b `) ||
		!strings.Contains(r.out, `billing\\charge`) || !strings.Contains(r.out, `bad \\x1b`) {
		t.Errorf("list (exit %d): the two IDs, the type and the reason as escapes:\n%s%s", r.code, r.out, r.err)
	}
	r = berth(t, b, "dlq", "show", "billing", forged.ID)
	if r.code != exitOK || !strings.Contains(r.out, "id:              job-1\\\\u200b\n") || !strings.Contains(r.out, `{"path":"C:\\dir"}`) {
		t.Errorf("show (exit %d): want the ID as job-1\\\\u200b and the JSON body as it is:\n%s%s", r.code, r.out, r.err)
	}
	// Escaped once, not once by the command and again on the way out.
	r = berth(t, b, "outbox", "requeue", `7\8`, "-yes")
	if r.code != exitUsage || !strings.Contains(r.err, `not "7\\8"`) {
		t.Errorf("outbox requeue of a bad row id (exit %d): want it as 7\\\\8:\n%s", r.code, r.err)
	}
	r = berth(t, b, "dlq", "show", "billing", forged.ID, "-json")
	var m struct{ ID string }
	if r.code != exitOK || json.Unmarshal([]byte(r.out), &m) != nil || m.ID != forged.ID {
		t.Errorf("show -json (exit %d): ID %q, want %q:\n%s", r.code, m.ID, forged.ID, r.out)
	}
}
