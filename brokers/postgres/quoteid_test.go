package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestDeadLetterErrorsEscapeIDOnce: the not-found errors of GetDeadLetter,
// RedriveDeadLetters and DeleteDeadLetters named the ID raw (%s), or, for
// one PostgreSQL cannot store, raw in hand-made quotes; the CLI escapes
// only what is still raw in an error (not backslashes), so an ID holding
// the characters \x1b and one holding an ESC byte read alike. They write
// it as sdk.ErrorText does: quoted with Go escapes exactly once.
func TestDeadLetterErrorsEscapeIDOnce(t *testing.T) {
	pool := newPool(t, "quoteid", 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := context.Background()
	for _, c := range []struct{ id, want string }{
		{`id\x1b` + "\x1b[31m", `"id\\x1b\x1b[31m"`}, // storable: looked up, not found
		{`a\b` + "\x00\x1b", `"a\\b\x00\x1b"`},       // a NUL byte: not storable
		{`a\b` + "\xff\x1b", `"a\\b\xff\x1b"`},       // invalid UTF-8: not storable
		{"plain-id", "dead letter plain-id of q"},    // plain IDs as they are
	} {
		_, getErr := b.GetDeadLetter(ctx, "q", c.id)
		_, redriveErr := b.RedriveDeadLetters(ctx, "q", c.id)
		_, deleteErr := b.DeleteDeadLetters(ctx, "q", c.id)
		for name, err := range map[string]error{"get": getErr, "redrive": redriveErr, "delete": deleteErr} {
			if !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("%s %q: %v, want ErrNotFound", name, c.id, err)
				continue
			}
			text := err.Error()
			if !strings.Contains(text, c.want) || strings.ContainsAny(text, "\x00\x1b") || !strings.Contains(text, "dead letter ") {
				t.Errorf("%s %q: %q, want the ID escaped once as %s", name, c.id, text, c.want)
			}
		}
	}
}
