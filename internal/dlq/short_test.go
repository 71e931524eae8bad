package dlq

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// cutCases are texts whose escapes a cut could split: a zero-width space
// (\u200b), a backslash (\\), a tag character (\U000e0041), ESC (\x1b), an
// invalid byte (\xff).
var cutCases = []string{
	"abcd\u200befgh",
	`abcd\u200b-literal`,
	"abc\U000E0041\U000E0042xyz",
	"ab\x1b[31mred",
	"abc\xffdef",
	`\\\\\\\\`,
	"plain text, long enough to be cut",
}

// checkCut reports what is wrong with cut, the one-line text of s cut to n
// runes: too long, or not the escape of a whole prefix of s (an escape cut
// in half) followed by "…".
func checkCut(s string, n int, cut string) string {
	if utf8.RuneCountInString(cut) > n {
		return "longer than n"
	}
	full := EscapeText(s, false)
	if cut == full {
		return ""
	}
	kept, ok := strings.CutSuffix(cut, "…")
	if !ok {
		return "cut without …"
	}
	for i := range s + "\x00" { // every rune boundary, the end included
		if i <= len(s) && EscapeText(s[:i], false) == kept {
			return ""
		}
	}
	return "cuts an escape: " + kept + " is no whole prefix of " + full
}

func TestEscapeTextShortCutsBetweenEscapes(t *testing.T) {
	for _, s := range cutCases {
		for n := 1; n <= utf8.RuneCountInString(EscapeText(s, false))+1; n++ {
			if got := EscapeTextShort(s, n); checkCut(s, n, got) != "" {
				t.Errorf("EscapeTextShort(%q, %d) = %q: %s", s, n, got, checkCut(s, n, got))
			}
		}
	}
}

// EscapeTextCut cuts as EscapeTextShort does, and says when it cut; with
// block, newlines and tabs are kept, and the cut is still between escapes.
func TestEscapeTextCut(t *testing.T) {
	for _, s := range append(cutCases, "two\nlines\tand a tab") {
		for n := 1; n <= utf8.RuneCountInString(EscapeText(s, false))+1; n++ {
			got, cut := EscapeTextCut(s, false, n)
			if want := EscapeTextShort(s, n); got != want || cut != (got != EscapeText(s, false)) {
				t.Errorf("EscapeTextCut(%q, %d) = %q, %v; want %q", s, n, got, cut, want)
			}
			block, cut := EscapeTextCut(s, true, n)
			kept, _ := strings.CutSuffix(block, "…")
			if utf8.RuneCountInString(block) > n || cut != strings.HasSuffix(block, "…") || !strings.HasPrefix(EscapeText(s, true), kept) {
				t.Errorf("EscapeTextCut(%q, block, %d) = %q, %v", s, n, block, cut)
			}
		}
	}
}
