package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestUnstorableIDQuotedAsRead: an ID PostgreSQL cannot store (here with a
// NUL byte) is named in the not-found error as read, in plain quotes, not
// Go-quoted: the CLI and dashboard escape error text once where they show
// it, and a %q before that showed every backslash doubled.
func TestUnstorableIDQuotedAsRead(t *testing.T) {
	pool := newPool(t, "quoteid", 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := context.Background()
	id := `a\b` + "\x00"
	want := `"` + id + `"`
	_, getErr := b.GetDeadLetter(ctx, "q", id)
	_, redriveErr := b.RedriveDeadLetters(ctx, "q", id)
	_, deleteErr := b.DeleteDeadLetters(ctx, "q", id)
	for name, err := range map[string]error{"get": getErr, "redrive": redriveErr, "delete": deleteErr} {
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
			continue
		}
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), `\\`) {
			t.Errorf("%s: %q, want the ID as read in plain quotes (%q)", name, err.Error(), want)
		}
	}
}
