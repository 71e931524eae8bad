package sdk_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/sdk"
)

// TestDecodeErrorEscapesMessageID: a DecodeError printed the message ID with
// %s, and sdk.Prepare only requires valid UTF-8, so a newline, an ANSI
// escape or U+202E in a producer's ID reached the dead-letter reason and the
// log line raw (the type beside it was already quoted).
func TestDecodeErrorEscapesMessageID(t *testing.T) {
	type payload struct{ N int }
	forged := "id\nberth: forged line\x1b[2J\u202e"
	_, err := sdk.Decode[payload](&sdk.Message{ID: forged, Type: "t", Body: []byte("{")})
	if err == nil {
		t.Fatal("Decode of a bad body succeeded")
	}
	text := err.Error()
	for _, raw := range []string{"\n", "\x1b", "\u202e"} {
		if strings.Contains(text, raw) {
			t.Errorf("error text %q holds %q raw", text, raw)
		}
	}
	if !strings.Contains(text, `"id\nberth: forged line\x1b[2J\u202e"`) {
		t.Errorf("error text %q does not quote the ID with Go escapes", text)
	}
	var de *sdk.DecodeError
	if !errors.As(err, &de) || de.MessageID != forged {
		t.Errorf("DecodeError.MessageID is not the raw ID: %+v", de)
	}
	// A plain ID is written as it is.
	_, err = sdk.Decode[payload](&sdk.Message{ID: "0190-abc", Type: "t", Body: []byte("{")})
	if err == nil || !strings.Contains(err.Error(), "message 0190-abc (type") {
		t.Errorf("plain ID: %v", err)
	}
}

// TestErrorText: text Go prints unescaped stays as it is; other text is
// quoted with Go escapes.
func TestErrorText(t *testing.T) {
	for in, want := range map[string]string{
		"order-17":    "order-17",
		"":            "",
		"a b":         "a b",
		"a\nb":        `"a\nb"`,
		"\x1b[31m":    `"\x1b[31m"`,
		"x\u202ey":    `"x\u202ey"`,
		"bad\xffutf8": `"bad\xffutf8"`,
		`back\slash`:  `"back\\slash"`, // unambiguous: a \ is not an escape
		"é—ü":         "é—ü",
	} {
		if got := sdk.ErrorText(in); got != want {
			t.Errorf("ErrorText(%q) = %s, want %s", in, got, want)
		}
	}
}
