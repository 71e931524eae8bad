package sqs

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// parseEnvelope decodes the "berth" attribute s into env, as
// json.Unmarshal(s, env) does. encode writes the attribute with
// json.Marshal: no spaces and, for most messages, no escapes. That shape
// is decoded here without reflection, with every string a substring of s
// (no copies); anything else (an escape, a space, an unknown or repeated
// key, a null, bytes that are not UTF-8) goes to json.Unmarshal, so
// untrusted input gets exactly the standard decoder's result or error.
func parseEnvelope(s string, env *envelope) error {
	if fastEnvelope(s, env) {
		return nil
	}
	*env = envelope{}
	return json.Unmarshal([]byte(s), env)
}

// fastEnvelope decodes s into env when s has the shape json.Marshal gives
// an envelope without escapes, and reports whether it did. When it reports
// false, env may hold part of s.
func fastEnvelope(s string, env *envelope) bool {
	*env = envelope{}
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return false
	}
	var seen uint8
	i := 1
	if s[i] == '}' {
		return i == len(s)-1
	}
	for {
		key, next, ok := plainString(s, i)
		if !ok || next >= len(s) || s[next] != ':' {
			return false
		}
		i = next + 1
		bit, field := envelopeField(env, key)
		if bit == 0 || seen&bit != 0 {
			return false // a key encode does not write (json matches keys without regard to case), or a repeated one
		}
		seen |= bit
		switch {
		case key == "v":
			j := i
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j == i || j-i > 9 || (s[i] == '0' && j-i > 1) {
				return false // none, too long for every int, or a leading zero (invalid JSON)
			}
			env.V, _ = strconv.Atoi(s[i:j])
			i = j
		case key == "h":
			j, ok := plainHeaders(s, i, env)
			if !ok {
				return false
			}
			i = j
		default:
			v, j, ok := plainString(s, i)
			if !ok {
				return false
			}
			*field = v
			i = j
		}
		if i >= len(s) {
			return false
		}
		switch s[i] {
		case ',':
			i++
		case '}':
			return i == len(s)-1
		default:
			return false
		}
	}
}

// envelopeField returns the bit that marks key as seen and, for a string
// field, where it goes; bit 0 for a key the envelope does not have.
func envelopeField(env *envelope, key string) (uint8, *string) {
	switch key {
	case "v":
		return 1 << 0, nil
	case "id":
		return 1 << 1, &env.ID
	case "t":
		return 1 << 2, &env.T
	case "ik":
		return 1 << 3, &env.IK
	case "k":
		return 1 << 4, &env.K
	case "c":
		return 1 << 5, &env.C
	case "e":
		return 1 << 6, &env.Enc
	case "h":
		return 1 << 7, nil
	}
	return 0, nil
}

// plainHeaders decodes the object of strings that starts at s[i] into
// env.H and returns the index after it; false for any other shape, a
// repeated name included (json keeps the last, the fallback decides).
func plainHeaders(s string, i int, env *envelope) (int, bool) {
	if i >= len(s) || s[i] != '{' {
		return 0, false
	}
	i++
	env.H = map[string]string{}
	if i < len(s) && s[i] == '}' {
		return i + 1, true
	}
	for {
		k, j, ok := plainString(s, i)
		if !ok || j >= len(s) || s[j] != ':' {
			return 0, false
		}
		v, j, ok := plainString(s, j+1)
		if !ok {
			return 0, false
		}
		if _, dup := env.H[k]; dup {
			return 0, false
		}
		env.H[k] = v
		if j >= len(s) {
			return 0, false
		}
		switch s[j] {
		case ',':
			i = j + 1
		case '}':
			return j + 1, true
		default:
			return 0, false
		}
	}
}

// plainString returns the JSON string that starts at s[i] when it holds no
// escape, no control character and only UTF-8, and the index after its
// closing quote.
func plainString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	end := strings.IndexByte(s[i+1:], '"')
	if end < 0 {
		return "", 0, false
	}
	v := s[i+1 : i+1+end]
	ascii := true
	for k := 0; k < len(v); k++ {
		switch c := v[k]; {
		case c == '\\' || c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii && !utf8.ValidString(v) {
		return "", 0, false // json.Unmarshal would put U+FFFD in place of the bad bytes
	}
	return v, i + 2 + end, true
}
