package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/berthq/berth/integration"
)

// TestJobsBadSchemaEscapedOnce: the ledger refused a bad -schema with the
// name %q-quoted, and berth escaped the error again where it printed it:
// a backslash showed as four, an ESC as \\x1b (an escape of an escape,
// which reads as the four characters \x1b). The name is escaped once, by
// the ledger (%q), and berth prints the error's escapes as they are.
func TestJobsBadSchemaEscapedOnce(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for schema, want := range map[string]string{
		`a\b`:       `identifier "a\\b": want`,
		"x\x1b[31m": `identifier "x\x1b[31m": want`,
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"jobs", "-db", dsn, "-schema", schema}, env{stdin: strings.NewReader(""),
			stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
		if code != exitUsage || !strings.Contains(errOut.String(), want) || strings.Contains(errOut.String(), "\x1b") {
			t.Errorf("jobs -schema %q: exit %d, stderr %q; want exit %d and %q", schema, code, errOut.String(), exitUsage, want)
		}
	}
}
