// Package jsontext holds what berth's brokers share to write JSON by hand
// on their hot paths, where encoding/json's reflection cost a message
// microseconds.
package jsontext

// Plain reports whether json.Marshal writes s between its quotes exactly
// as it is: printable ASCII other than '"' and '\' and the '<', '>' and
// '&' it escapes for HTML. Such a string may be appended between quotes
// without escaping, and is text any broker accepts (SQS, NATS headers).
func Plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
