package dlq

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// EscapeText makes untrusted text safe to print: control characters (tab,
// newline and ESC included, so no terminal escape sequence gets through),
// bidirectional-text overrides, invisible characters (zero-width spaces and
// joiners, the byte-order mark, soft hyphens, tag characters, Hangul
// fillers, variation selectors: text that looks like other text, or hides
// text), line and paragraph separators, and invalid UTF-8 are written as Go-style escapes
// (\x1b, \u202e, \u200b, \xff), and a backslash is written \\, so that
// every escape is unambiguous: an ID spelt with the six characters \u200b
// shows as \\u200b, one with a zero-width space as \u200b. With block,
// newlines and tabs are kept. HTML needs its own escaping on top
// (html/template does it).
func EscapeText(s string, block bool) string {
	return escapeText(s, block, false)
}

// EscapeErrorText is EscapeText (one line) for the text of an error,
// whose untrusted values were escaped once where the error was made: Go
// escapes in quotes ([sdk.ErrorText], %q) in berth's packages, EscapeText
// in the CLI. What it still holds raw (a control or invisible character, a
// bidirectional-text control, invalid UTF-8, from a value an error names
// as it is) is escaped as EscapeText does, but a backslash is left as it
// is: escaped again, each escape of those values would print as an escape
// of an escape (\\x1b, which reads as the four characters \x1b).
func EscapeErrorText(s string) string {
	return escapeText(s, false, true)
}

// EscapeJSONText is EscapeText with block for a valid JSON document (as
// [encoding/json.Valid] accepts it), shown as JSON: backslashes are left as
// they are, since in JSON a backslash always starts an escape, and every
// escape EscapeText writes either means in JSON what it means here (\u202e,
// \n) or is not JSON at all (\x1b, \U000e0041, \xff), so nothing reads
// as anything it is not.
func EscapeJSONText(s string) string {
	return escapeText(s, true, true)
}

func escapeText(s string, block, jsonDoc bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) || (r == '\\' && !jsonDoc) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		i += writeEscaped(&b, s, i, block, jsonDoc)
	}
	return b.String()
}

// writeEscaped writes the rune (or invalid byte) at s[i:] to b as
// escapeText does and returns how many bytes of s it took.
func writeEscaped(b *strings.Builder, s string, i int, block, jsonDoc bool) int {
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && n == 1:
		fmt.Fprintf(b, `\x%02x`, s[i])
	case block && (r == '\n' || r == '\t'):
		b.WriteRune(r)
	case r == '\n':
		b.WriteString(`\n`)
	case r == '\t':
		b.WriteString(`\t`)
	case r == '\r':
		b.WriteString(`\r`)
	case r == '\\' && !jsonDoc:
		b.WriteString(`\\`)
	case unsafeRune(r):
		q := strconv.QuoteRuneToASCII(r) // '\x1b', '\u202e'
		b.WriteString(q[1 : len(q)-1])
	default:
		b.WriteString(s[i : i+n])
	}
	return n
}

// EscapeTextShort is EscapeText (one line) cut to at most n runes, the
// last of them "…" when it was cut. It cuts between whole escapes, never
// inside one: a cut \u200b or \\ would read as other text (\u20, or a
// lone backslash that escapes what follows).
func EscapeTextShort(s string, n int) string {
	e := EscapeText(s, false)
	if utf8.RuneCountInString(e) <= n {
		return e
	}
	var b, piece strings.Builder
	room := max(n-1, 0) // runes left before the "…"
	for i := 0; i < len(s); {
		piece.Reset()
		i += writeEscaped(&piece, s, i, false, false)
		w := utf8.RuneCountInString(piece.String())
		if w > room {
			break
		}
		b.WriteString(piece.String())
		room -= w
	}
	return b.String() + "…"
}

// EscapeTextCut is EscapeText(s, block) when that is at most n runes, and
// else it cut to at most n runes as [EscapeTextShort] cuts it (between
// whole escapes, the last rune "…"); cut reports which. Unlike them it
// reads no more of s than it shows, whatever the length of s (a header
// forged at megabytes).
func EscapeTextCut(s string, block bool, n int) (text string, cut bool) {
	if text, whole := escapeWithin(s, block, n); whole {
		return text, false
	}
	text, _ = escapeWithin(s, block, max(n-1, 0)) // room for the "…"
	return text + "…", true
}

// escapeWithin is EscapeText(s, block) cut, between whole escapes, to at
// most room runes; whole reports that nothing was cut. It reads no more of
// s than it returns, and one escape more.
func escapeWithin(s string, block bool, room int) (text string, whole bool) {
	var b, piece strings.Builder
	i := 0
	for i < len(s) {
		piece.Reset()
		k := writeEscaped(&piece, s, i, block, false)
		w := utf8.RuneCountInString(piece.String())
		if w > room {
			break
		}
		b.WriteString(piece.String())
		room -= w
		i += k
	}
	return b.String(), i == len(s)
}

func unsafeRune(r rune) bool {
	if unicode.IsControl(r) { // C0, DEL, C1 (CSI is U+009B)
		return true
	}
	switch {
	case r == 0x061C, r == 0x200E, r == 0x200F, r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
		return true // bidi controls: text that reads differently from what it is
	case unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector):
		// Invisible (Unicode's default-ignorable code points): zero-width
		// space, non-joiner and joiner, word joiner, BOM, soft hyphen, tag
		// characters (U+E0000 block, which can spell out hidden text),
		// Hangul fillers, variation selectors. An ID with one looks like
		// another ID; a reason can hide words.
		return true
	case r == 0x2028, r == 0x2029:
		return true // line and paragraph separators: a line break to some terminals and viewers
	}
	return false
}

// EscapeJSON rewrites the characters of encoded JSON (as json.Marshal
// writes it) that would act on a terminal, reorder the text around them or
// not show at all, and that encoding/json leaves as they are (DEL, the C1
// controls, U+009B CSI among them, the bidirectional-text controls and the
// invisible characters EscapeText escapes), as \u escapes: the
// same JSON values, safe to print. It returns b itself when there are none.
// Such characters can only be inside JSON strings, where \u escapes mean
// them exactly.
func EscapeJSON(b []byte) []byte {
	i := 0
	for i < len(b) {
		if b[i] < 0x7f {
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError && unsafeRune(r) {
			break
		}
		i += n
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+12)
	out = append(out, b[:i]...)
	for i < len(b) {
		if b[i] < 0x7f {
			out = append(out, b[i])
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError && unsafeRune(r) {
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2) // beyond U+FFFF: a surrogate pair, as JSON spells it
			} else {
				out = fmt.Appendf(out, `\u%04x`, r)
			}
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}
