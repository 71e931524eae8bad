package dlq_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/dlq"
)

// A backslash is escaped too (as \\), so that the escapes EscapeText writes
// are unambiguous: an ID spelt with the six characters \u200b and an ID with
// a zero-width space printed the same, `job-\u200b`. Before, a backslash
// was printed as it is. The escaped text reads back, as a Go string literal
// (or bash's $'…'), to the exact text.
func TestEscapeTextBackslash(t *testing.T) {
	for _, block := range []bool{false, true} {
		literal, zwsp := dlq.EscapeText(`job-\u200b`, block), dlq.EscapeText("job-\u200b", block)
		if literal == zwsp {
			t.Errorf("block %v: `job-\\u200b` and job-<U+200B> both print as %q", block, literal)
		}
		if want := `job-\\u200b`; literal != want {
			t.Errorf("block %v: EscapeText(`job-\\u200b`) = %q, want %q", block, literal, want)
		}
	}
	for _, s := range []string{`plain`, `C:\dir\file`, `job-\u200b`, "job-\u200b", `\x1b`, "\x1b[2J", `\\`, "a\\\u202eb",
		"bad \xff byte", `ends with \`, "tag\U000e0041", `say "hi"\n`, "tab\there\nnewline\r"} {
		e := dlq.EscapeText(s, false)
		// A '"' is never part of an escape: quoting it makes e a Go literal.
		back, err := strconv.Unquote(`"` + strings.ReplaceAll(e, `"`, `\"`) + `"`)
		if err != nil || back != s {
			t.Errorf("EscapeText(%q) = %q reads back as %q (%v)", s, e, back, err)
		}
	}
}

// EscapeJSONText shows a JSON document as JSON: its own escapes (\\, \",
// \u200b) are left as they are, and a raw character it escapes gets an
// escape that means the same in JSON, so the text shown is still the
// document's JSON.
func TestEscapeJSONText(t *testing.T) {
	for _, doc := range []string{`{"path": "C:\\dir", "q": "say \"hi\""}`, `{"id": "job-\u200b"}`, "{\"id\": \"job-\u200b\u202e\"}", "[\"\u0085\"]"} {
		e := dlq.EscapeJSONText(doc)
		var want, got any
		if err := json.Unmarshal([]byte(doc), &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(e), &got); err != nil || !jsonEqual(got, want) {
			t.Errorf("EscapeJSONText(%q) = %q: %v, reads as %v, want %v", doc, e, err, got, want)
		}
		if strings.ContainsAny(e, "\u200b\u202e\u0085") {
			t.Errorf("EscapeJSONText(%q) = %q: left raw", doc, e)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// EscapeErrorText shows an error's text whose values were Go-quoted where
// the error was made (sdk.ErrorText, %q) with those escapes as they are,
// once, and escapes what is still raw in it: nothing reaches a terminal raw.
func TestEscapeErrorText(t *testing.T) {
	for in, want := range map[string]string{
		`no dead letter "ev\x1b[31m"`:    `no dead letter "ev\x1b[31m"`, // quoted by the package: once
		"no dead letter ev\x1b[31m":      `no dead letter ev\x1b[31m`,   // named as it is: escaped here
		"bidi \u202e, zero-width \u200b": `bidi \u202e, zero-width \u200b`,
		"a\nb\tc \xff":                   `a\nb\tc \xff`,
		`C:\dir`:                         `C:\dir`,
	} {
		if got := dlq.EscapeErrorText(in); got != want {
			t.Errorf("EscapeErrorText(%q) = %q, want %q", in, got, want)
		}
	}
}
