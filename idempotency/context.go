package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"unicode/utf8"
)

type guardKey struct{}

// running is what the guard puts in the handler's context.
type running struct {
	key string
	mu  sync.Mutex
	res Result
}

// KeyFrom returns the idempotency key of the operation the handler runs
// under, to pass on to an external API (lease mode), and whether there is one.
func KeyFrom(ctx context.Context) (string, bool) {
	r, ok := ctx.Value(guardKey{}).(*running)
	if !ok {
		return "", false
	}
	return r.key, true
}

// SetResult records the result the guard stores with the key when the handler
// returns nil. It reports false, and records nothing, when ctx does not come
// from the idempotency middleware or an [Inbox], or when the result is one
// PostgreSQL cannot store: res.JSON set but not valid JSON, not UTF-8, or
// holding a \u0000 or unpaired surrogate escape or a number outside
// numeric's range (jsonb refuses them: more than 131072 digits before the
// decimal point or 16383 after it, as in 1e131072 or 1e-16384), or
// ResourceType or ResourceID not UTF-8 or holding a NUL byte (text refuses
// them). A store that refused the result at completion would leave a
// lease-mode claim in progress, and the redelivery that takes it over would
// apply the effect again. res.JSON is copied.
func SetResult(ctx context.Context, res Result) bool {
	r, ok := ctx.Value(guardKey{}).(*running)
	if !ok {
		return false
	}
	if !storableText(res.ResourceType) || !storableText(res.ResourceID) {
		return false
	}
	if res.JSON != nil {
		if !json.Valid(res.JSON) || !utf8.Valid(res.JSON) || !storableEscapes(res.JSON) || !storableNumbers(res.JSON) {
			return false
		}
		res.JSON = bytes.Clone(res.JSON)
	}
	r.mu.Lock()
	r.res = res
	r.mu.Unlock()
	return true
}

func (r *running) result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res
}

// storableText reports whether PostgreSQL's text can hold s: UTF-8 without
// NUL bytes.
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// storableEscapes reports whether jsonb accepts the \u escapes of b, valid
// JSON: none is \u0000, and every surrogate escape is a high one followed by
// a low one. In valid JSON a backslash only occurs in a string, where it
// starts an escape, so the escapes are found without tracking strings.
func storableEscapes(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if b[i] != 'u' {
			continue
		}
		v := hex4(b[i+1 : i+5])
		i += 4
		switch {
		case v == 0, v >= 0xDC00 && v < 0xE000:
			return false
		case v >= 0xD800 && v < 0xDC00:
			if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
				return false
			}
			if lo := hex4(b[i+3 : i+7]); lo < 0xDC00 || lo >= 0xE000 {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 is the value of four hex digits (valid: b comes from valid JSON).
func hex4(b []byte) rune {
	var v rune
	for _, c := range b {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			v |= rune(c - 'a' + 10)
		default:
			v |= rune(c - 'A' + 10)
		}
	}
	return v
}

// storableNumbers reports whether jsonb's numeric holds every number of b,
// valid JSON: at most 131072 digits before the decimal point and 16383
// after it (numeric's int16 weight and 14-bit scale; "value overflows numeric format"
// otherwise), however the number is written (1e131072, 1e-16384, a long
// digit string). Strings are skipped.
func storableNumbers(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++ // the escaped character, maybe a quote
				}
			}
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(b) && strings.IndexByte("+-.0123456789eE", b[j]) >= 0 {
				j++
			}
			if !storableNumber(b[i:j]) {
				return false
			}
			i = j - 1
		}
	}
	return true
}

// storableNumber reports whether PostgreSQL's numeric input accepts n, a
// valid JSON number.
func storableNumber(n []byte) bool {
	const (
		maxExp   = 1<<30 - 1 // numeric refuses an exponent of INT_MAX/2 or more
		maxScale = 16383     // digits after the decimal point
		maxPos   = 131071    // decimal position of the leading digit
	)
	if n[0] == '-' {
		n = n[1:]
	}
	end := len(n)
	var exp int64
	if e := bytes.IndexAny(n, "eE"); e >= 0 {
		end = e
		d := n[e+1:]
		neg := d[0] == '-'
		if d[0] == '-' || d[0] == '+' {
			d = d[1:]
		}
		for _, c := range d {
			if exp = exp*10 + int64(c-'0'); exp >= maxExp {
				return false
			}
		}
		if neg {
			exp = -exp
		}
	}
	intPart, frac := n[:end], []byte(nil)
	if p := bytes.IndexByte(intPart, '.'); p >= 0 {
		intPart, frac = intPart[:p], intPart[p+1:]
	}
	if int64(len(frac))-exp > maxScale {
		return false
	}
	// The leading digit is at 10^(len(intPart)-1-k+exp), k its index in
	// intPart followed by frac.
	k := bytes.IndexFunc(intPart, func(r rune) bool { return r != '0' })
	if k < 0 {
		if k = bytes.IndexFunc(frac, func(r rune) bool { return r != '0' }); k < 0 {
			return true // zero
		}
		k += len(intPart)
	}
	return int64(len(intPart)-1-k)+exp <= maxPos
}
