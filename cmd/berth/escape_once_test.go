package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// quotingBroker names an ID it does not hold as the packages of berth do
// in an error's text: with sdk.ErrorText (Go escapes, in quotes).
type quotingBroker struct{ *memory.Broker }

func (quotingBroker) Close() error { return nil }

func (q quotingBroker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	m, err := q.Broker.GetDeadLetter(ctx, queue, id)
	if errors.Is(err, sdk.ErrNotFound) {
		return nil, fmt.Errorf("no dead letter %s of %s: %w", sdk.ErrorText(id), sdk.ErrorText(queue), sdk.ErrNotFound)
	}
	return m, err
}

// TestErrorsEscapedOnce: an error naming untrusted text (an ID, a queue, a
// flag's value) shows it escaped once: an ESC as \x1b, never raw, and
// never as \\x1b (an escape of the escape, which reads as the four
// characters \x1b). The packages quote such text with Go escapes
// (sdk.ErrorText, %q), and berth escaped the whole error again where it
// printed it.
func TestErrorsEscapedOnce(t *testing.T) {
	b, _ := deadLettered(t, 1)
	const id = "ev\x1b[31m"
	quoting := env{open: func(context.Context, string) (sdk.Broker, error) { return quotingBroker{b}, nil }}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"dlq", "show", "billing", id}, exitNotFound, `no dead letter "ev\x1b[31m" of billing`},
		{[]string{"dlq", "list", "ev\x1b[31m"}, exitError, `invalid queue name "ev\x1b[31m"`},
		{[]string{"stats", "ev\x1b[31m"}, exitError, `invalid queue name "ev\x1b[31m"`},
		{[]string{"queue", "pause", "ev\x1b[31m", "-db", "postgres://127.0.0.1:1/x"}, exitUsage, `invalid queue name "ev\x1b[31m"`},
		{[]string{"dlq", "list", "billing", "-older-than", "ev\x1b[31m"}, exitUsage, `invalid value "ev\x1b[31m" for flag -older-than`},
		// The CLI's own errors escape what they name, once.
		{[]string{"dlq", "purge", "billing", "-yes", "--", `a\b` + id}, exitNotFound, `no dead letter of billing matches`},
		{[]string{"outbox", "requeue", "-yes", `7\8` + id}, exitUsage, `not "7\\8ev\x1b[31m"`},
	} {
		r := berthEnv(t, context.Background(), b, quoting, c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.want) || strings.Contains(r.err+r.out, `\\x1b`) || strings.ContainsRune(r.err+r.out, 0x1b) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q, escaped once", c.args, r.code, r.err, c.code, c.want)
		}
	}
	// A job show that finds no job names the ID, escaped once (by the
	// ledger).
	dsn, schema, _ := migratedLedger(t, "cli_ledger_")
	r := cliDB(t, "", false, "job", "show", `k\`+id, "-db", dsn, "-schema", schema)
	if strings.Contains(r.err, `\\x1b`) || strings.ContainsRune(r.err, 0x1b) || !strings.Contains(r.err, `k\\ev\x1b[31m`) {
		t.Errorf("job show: exit %d, stderr %q: want the ID escaped once", r.code, r.err)
	}
}
