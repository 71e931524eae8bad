package memory_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// forgedID holds a literal backslash sequence (the 4 characters \x1b) and
// an ESC byte: once escaped by sdk.ErrorText they read differently.
const forgedID = `id\x1b` + "\x1b[31m"

// wantForged is forgedID as sdk.ErrorText writes it: quoted, the literal
// backslash doubled, the ESC byte escaped.
const wantForged = `"id\\x1b\x1b[31m"`

// checkEscapedOnce fails unless err wraps target and names forgedID escaped
// exactly once, with no raw ESC byte.
func checkEscapedOnce(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: %v, want an error wrapping %v", what, err, target)
		return
	}
	text := err.Error()
	if strings.Contains(text, "\x1b") || !strings.Contains(text, wantForged) {
		t.Errorf("%s: %q, want the ID escaped once as %s and no raw ESC", what, text, wantForged)
	}
}

// TestErrorsEscapeMessageID: the not-found and lease-lost errors wrote the
// message ID raw, so a CLI escaping the error text once showed an ID
// holding the characters \x1b and one holding an ESC byte alike.
func TestErrorsEscapeMessageID(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: time.Millisecond})
	ctx := ctxT(t)
	_, err := b.GetDeadLetter(ctx, "q", forgedID)
	checkEscapedOnce(t, "GetDeadLetter", err, sdk.ErrNotFound)
	_, err = b.RedriveDeadLetters(ctx, "q", forgedID)
	checkEscapedOnce(t, "RedriveDeadLetters", err, sdk.ErrNotFound)
	_, err = b.DeleteDeadLetters(ctx, "q", forgedID)
	checkEscapedOnce(t, "DeleteDeadLetters", err, sdk.ErrNotFound)

	if err := b.Publish(ctx, "q", &sdk.Message{ID: forgedID, Type: "t"}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	first := receiveOne(t, b, "q")
	second := receiveOne(t, b, "q") // the first lease ended: delivered again
	checkEscapedOnce(t, "Ack after the lease", first.Ack(ctx), sdk.ErrLeaseLost)
	if err := second.Ack(ctx); err != nil {
		t.Errorf("Ack of the second delivery: %v", err)
	}
}
