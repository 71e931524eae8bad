package sqs

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/berthq/berth/sdk"
)

// TestPlainEnvelopeIsWhatMarshalWrites: the hand-written envelope of a
// message whose fields need no escaping is, byte for byte, json.Marshal's;
// a field that needs escaping, or headers, take json.Marshal's path.
func TestPlainEnvelopeIsWhatMarshalWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	alphabet := []rune("abcXYZ019-_.:/ {}[]'\"\\<>&\t\x00\x7féü€😀")
	str := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		n := 1 + r.IntN(12)
		out := make([]rune, n)
		for i := range out {
			if r.IntN(4) == 0 {
				out[i] = alphabet[r.IntN(len(alphabet))]
			} else {
				out[i] = alphabet[r.IntN(15)] // printable, mostly plain
			}
		}
		return string(out)
	}
	plain, escaped := 0, 0
	for range 20000 {
		m := &sdk.Message{ID: str(), Type: str(), IdempotencyKey: str(), Key: str(), CorrelationID: str()}
		if r.IntN(10) == 0 {
			m.Headers = map[string]string{"h": str()}
		}
		enc := []string{encText, encEmpty, encBase64}[r.IntN(3)]
		raw, err := json.Marshal(envelope{V: 1, ID: m.ID, T: m.Type, IK: m.IdempotencyKey, K: m.Key, C: m.CorrelationID, Enc: enc, H: m.Headers})
		if err != nil {
			t.Fatal(err)
		}
		want := escapeNonSQS(raw)
		got, ok := appendPlainEnvelope(m, enc)
		if ok {
			plain++
			if got != want {
				t.Fatalf("plain envelope of %+v\n got %s\nwant %s", m, got, want)
			}
		} else {
			escaped++
			if len(m.Headers) == 0 && want == string(raw) && !needsEscape(m, enc) {
				t.Fatalf("%+v needs no escaping but took json.Marshal's path", m)
			}
		}
		if v, err := encodeAttr(m, enc); err != nil || v != want {
			t.Fatalf("encodeAttr(%+v) = %s, %v; want %s", m, v, err, want)
		}
	}
	if plain < 1000 || escaped < 1000 {
		t.Fatalf("%d plain and %d escaped envelopes: the test covers too little of one path", plain, escaped)
	}
}

// needsEscape reports whether a field of m holds a character json.Marshal
// escapes or SQS refuses (everything outside printable ASCII counts).
func needsEscape(m *sdk.Message, enc string) bool {
	for _, s := range []string{m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID, enc} {
		for _, c := range []byte(s) {
			if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return true
			}
		}
	}
	return false
}
