package sdk

import (
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxLogTextLength bounds, in bytes, a message field ([Message.ID],
// [Message.Type], [Message.CorrelationID]) as berth writes it into a log
// record: see [LogText].
const MaxLogTextLength = 256

// LogText returns a log attribute holding s, a value taken from a message,
// made fit for a log record: invalid UTF-8 becomes U+FFFD and the text is cut
// to [MaxLogTextLength] bytes, ending in "…" when cut. A message's fields
// come from its producer, who may be outside berth: slog's handlers quote
// and escape what they write, but nothing else bounds it, and a 100 KiB type
// would be written whole into every record about its message. berth's
// Worker and brokers log message fields through it; applications' own
// middleware may too.
func LogText(key, s string) slog.Attr {
	return slog.String(key, cutText(s, MaxLogTextLength))
}

// LogCause returns a log attribute for err, a handler's error or another
// cause that may quote a message: its text, made valid UTF-8 and cut to
// [MaxReasonLength] bytes (as [SanitizeReason] does), computed only when a
// handler writes the record. A nil err is logged as nil.
func LogCause(key string, err error) slog.Attr {
	return slog.Any(key, causeText{err})
}

// causeText is an error logged as its sanitized text (see LogCause).
type causeText struct{ err error }

// LogValue implements slog.LogValuer.
func (c causeText) LogValue() slog.Value {
	if c.err == nil {
		return slog.AnyValue(nil)
	}
	return slog.StringValue(panicText(c.err)) // safe from an Error method that panics
}

// cutText is s made valid UTF-8 and cut to limit bytes on a rune boundary,
// ending in "…" when cut.
func cutText(s string, limit int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= limit {
		return s
	}
	cut := limit - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ErrorText returns s, a value taken from a message (an ID, a type, a key)
// or read from a row, as it may appear in an error's text: s itself when Go
// would print it unescaped, else s quoted with Go escapes (a newline, a
// control or bidirectional-text character, invalid UTF-8). An error's text
// becomes a dead-letter reason, a log line and a terminal's output; a
// forged newline or escape sequence must not reach them raw.
func ErrorText(s string) string {
	if q := strconv.Quote(s); q[1:len(q)-1] != s {
		return q
	}
	return s
}
