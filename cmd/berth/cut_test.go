package main

import (
	"strings"
	"testing"
)

// oneLine cuts a column between whole escapes: before, it escaped and then
// cut by rune, leaving half an escape (\u20, or a lone \ that read as the
// start of an escape of what followed).
func TestOneLineCutsBetweenEscapes(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"abcd\u200befgh", 6, "abcd…"},         // not abcd\…
		{"abcd\u200befgh", 8, "abcd…"},         // not abcd\u2…
		{"abcd\u200befgh", 11, "abcd\\u200b…"}, // the whole escape fits
		{`abcd\x`, 6, "abcd…"},                 // a backslash is \\: not abcd\…
		{`abcd\x`, 7, `abcd\\x`},               // fits whole
		{"ab\x1b[31mred", 5, "ab…"},            // not ab\x…
		{"abc\xffdef", 5, "abc…"},              // an invalid byte's \xff, not abc\…
		{"plain text", 6, "plain…"},
	} {
		if got := oneLine(c.s, c.n); got != c.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

// An argument named in an error is escaped once, where the error is shown:
// -status quoted it with %q and the error was escaped again on stderr, so a
// backslash showed as four and an ESC as \\x1b.
func TestErrorsEscapeArgumentsOnce(t *testing.T) {
	b, _ := deadLettered(t, 1)
	r := berth(t, b, "jobs", "-db", "postgres://127.0.0.1:1/none", "-status", "dead,de\\ad\x1b")
	if r.code != exitUsage || !strings.Contains(r.err, `-status "de\\ad\x1b": want one or more of`) {
		t.Fatalf("bad -status (exit %d):\n%s", r.code, r.err)
	}
}
