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
