package sqs

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/sdk"
)

// TestLeaseLostEscapesMessageID: leaseLost wrote the message ID raw, an ID
// holding the characters \x1b reading like one holding an ESC byte once
// the CLI escaped the error text.
func TestLeaseLostEscapesMessageID(t *testing.T) {
	const forged = `id\x1b` + "\x1b[31m"
	const want = `"id\\x1b\x1b[31m"`
	for _, err := range []error{leaseLost(forged, nil), leaseLost(forged, errors.New("stale"))} {
		if !errors.Is(err, sdk.ErrLeaseLost) {
			t.Errorf("%v, want an error wrapping ErrLeaseLost", err)
		}
		if text := err.Error(); strings.Contains(text, "\x1b") || !strings.Contains(text, want) {
			t.Errorf("%q, want the ID escaped once as %s and no raw ESC", text, want)
		}
	}
}
