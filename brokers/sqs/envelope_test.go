package sqs

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

// envelopeSeeds are attributes encode writes and near misses of their shape.
func envelopeSeeds(t testing.TB) []string {
	msgs := []*sdk.Message{
		{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Type: "billing.charge", Body: []byte(`{"order":1}`)},
		{ID: "id", Type: "t", IdempotencyKey: "ik", Key: "k", CorrelationID: "c", Body: nil},
		{ID: "id", Type: "é ü 日本 \u2028", Body: []byte{0, 1, 2, 0xff}},
		{ID: "id", Type: `quote " backslash \ <tag> & tab	`, CorrelationID: "id"},
		{ID: "id", Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "baggage": "k=v"}},
		{ID: "id", Headers: map[string]string{"x": "\x01 control", "y": "ok"}},
		{ID: "id", Headers: map[string]string{}},
	}
	var seeds []string
	for _, m := range msgs {
		e, err := encode(m)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		seeds = append(seeds, aws.ToString(e.attrs[attrName].StringValue))
	}
	return append(seeds,
		`{}`, `{"v":1}`, `{"v":0}`, `{"v":01}`, `{"v":-1}`, `{"v":1.0}`, `{"v":1e2}`, `{"v":1234567890123}`,
		`{"ID":"upper"}`, `{"id":"a","id":"b"}`, `{"id":null}`, `{"t":1}`, `{"id":"a",}`, `{"id":"a"} `, ` {"id":"a"}`,
		`{"id":"a"}}`, `{"id" :"a"}`, `{"h":{"a":"1","a":"2"}}`, `{"h":{}}`, `{"h":null}`, `{"h":{"a":1}}`, `{"x":"unknown"}`,
		"{\"id\":\"\xff\xfe\"}", `{"id":"\u0041"}`, `{"id":"a\"b"}`, `{"id":"`, `{`, `"id"`, ``, `{"e":"b64","id":"x"}`,
	)
}

// TestFastEnvelopeMatchesJSON: where the fast decoder takes an attribute,
// it decodes it as encoding/json does; and it takes what encode writes for
// plain messages.
func TestFastEnvelopeMatchesJSON(t *testing.T) {
	for _, s := range envelopeSeeds(t) {
		checkEnvelope(t, s)
	}
	var env envelope
	for _, s := range envelopeSeeds(t)[:2] {
		if !fastEnvelope(s, &env) {
			t.Errorf("the fast decoder refused %s, an attribute encode writes for a plain message", s)
		}
	}
	if !fastEnvelope(envelopeSeeds(t)[4], &env) || env.H["baggage"] != "k=v" {
		t.Errorf("the fast decoder refused or misread headers: %+v", env)
	}
}

// FuzzEnvelope: parseEnvelope gives json.Unmarshal's result and error on
// any input, whichever path decodes it.
func FuzzEnvelope(f *testing.F) {
	for _, s := range envelopeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkEnvelope(t, s) })
}

func checkEnvelope(t *testing.T, s string) {
	t.Helper()
	var want envelope
	werr := json.Unmarshal([]byte(s), &want)
	var fast envelope
	if fastEnvelope(s, &fast) {
		if werr != nil {
			t.Fatalf("fast decoder took %q, which json refuses: %v", s, werr)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("%q: fast decoder %+v, json %+v", s, fast, want)
		}
	}
	var got envelope
	gerr := parseEnvelope(s, &got)
	if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
		t.Fatalf("%q: parseEnvelope error %v, json %v", s, gerr, werr)
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: parseEnvelope %+v, json %+v", s, got, want)
	}
}

// BenchmarkDecode is decode of a plain message with berth's attribute.
func BenchmarkDecode(b *testing.B) {
	m := &sdk.Message{ID: sdk.NewID(), Type: "bench", Body: []byte(strings.Repeat("a", 256))}
	m.CorrelationID = m.ID
	e, err := encode(m)
	if err != nil {
		b.Fatal(err)
	}
	msg := sqstypes.Message{MessageId: aws.String("x"), Body: aws.String(e.body), MessageAttributes: e.attrs}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decode(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnvelope is the attribute's decode alone: the fast path against
// encoding/json on the same attribute.
func BenchmarkEnvelope(b *testing.B) {
	m := &sdk.Message{ID: sdk.NewID(), Type: "billing.charge"}
	m.CorrelationID = m.ID
	e, err := encode(m)
	if err != nil {
		b.Fatal(err)
	}
	s := aws.ToString(e.attrs[attrName].StringValue)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		var env envelope
		for b.Loop() {
			if err := parseEnvelope(s, &env); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var env envelope
			if err := json.Unmarshal([]byte(s), &env); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestFastEnvelopeGenerated builds attributes in and around the shape the
// fast decoder takes — keys in any order, repeated, in other cases; values
// of every form; strings of ASCII, quotes, escapes, control bytes, UTF-8
// and broken UTF-8 — and checks each as FuzzEnvelope does. Random mutation
// alone mostly explores json's own path; these reach the fast one.
func TestFastEnvelopeGenerated(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "Z", "0", "-", " ", `\"`, `\\`, `\u0041`, "\x00", "\x1f", "\x7f", "é", "日", "\u2028", "\ufffd",
		"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "<", "&", "\U0001F600", `"`, "}", ",", ":"}
	str := func() string {
		var sb strings.Builder
		sb.WriteByte('"')
		for range rng.IntN(6) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		sb.WriteByte('"')
		return sb.String()
	}
	keys := []string{"v", "id", "t", "ik", "k", "c", "e", "h", "ID", "T", "x", "", "ſ", "K"}
	nums := []string{"0", "1", "7", "01", "-1", "1.0", "1e2", "123456789", "1234567890", "99999999999999999999", "", "null", `"1"`}
	value := func(key string) string {
		switch {
		case key == "v" && rng.IntN(8) > 0:
			return nums[rng.IntN(len(nums))]
		case key == "h" && rng.IntN(8) > 0:
			var sb strings.Builder
			sb.WriteByte('{')
			for i := range rng.IntN(4) {
				if i > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(str() + ":" + str())
			}
			if rng.IntN(10) == 0 {
				sb.WriteString(`,"dup":"1","dup":"2"`)
			}
			sb.WriteByte('}')
			return sb.String()
		case rng.IntN(20) == 0:
			return "null"
		}
		return str()
	}
	fast := 0
	for range 20000 {
		var sb strings.Builder
		sb.WriteByte('{')
		for i := range rng.IntN(6) {
			if i > 0 {
				sb.WriteByte(',')
			}
			k := keys[rng.IntN(len(keys))]
			sb.WriteString(`"` + k + `":` + value(k))
		}
		sb.WriteByte('}')
		s := sb.String()
		if rng.IntN(20) == 0 { // junk around it
			s = []string{" ", "x", "}", ","}[rng.IntN(4)] + s
		}
		checkEnvelope(t, s)
		var env envelope
		if fastEnvelope(s, &env) {
			fast++
		}
	}
	if fast < 1000 {
		t.Fatalf("only %d of 20000 generated attributes took the fast path: the generator no longer reaches it", fast)
	}
	t.Logf("%d of 20000 generated attributes took the fast path", fast)
}

// TestIsSQSTextMatchesRunes checks isSQSText's ASCII fast path against the
// rule it stands for, sqsRune on every rune (invalid UTF-8 refused), on
// every single byte and on random short byte strings.
func TestIsSQSTextMatchesRunes(t *testing.T) {
	want := func(b []byte) bool {
		if !utf8.Valid(b) {
			return false
		}
		for _, r := range string(b) {
			if !sqsRune(r) {
				return false
			}
		}
		return true
	}
	for c := range 256 {
		b := []byte{'a', byte(c), 'z'}
		if got := isSQSText(b); got != want(b) {
			t.Fatalf("isSQSText(%q) = %v, want %v", b, got, want(b))
		}
	}
	// Every byte value at every position of a printable run long enough for
	// the word-at-a-time path (and its tail), and two of them together.
	for n := range 25 {
		for pos := range n {
			for c := range 256 {
				b := []byte(strings.Repeat("{a Z~}", 5)[:n])
				b[pos] = byte(c)
				if got := isSQSText(b); got != want(b) {
					t.Fatalf("isSQSText(%q) = %v, want %v", b, got, want(b))
				}
				for other := 0; other < n; other += 3 {
					b2 := bytes.Clone(b)
					b2[other] = byte(255 - c)
					if got := isSQSText(b2); got != want(b2) {
						t.Fatalf("isSQSText(%q) = %v, want %v", b2, got, want(b2))
					}
				}
			}
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("\x00\x01\t\n\r\x1f az{}\"\\\x7f\xc3\xa9\xed\xa0\x80\xef\xbf\xbe\xef\xbf\xbf\xf0\x9f\x98\x80")
	for i := range 200000 {
		b := make([]byte, rnd.IntN(12))
		if i%2 == 1 { // long, mostly printable: the word path with a rare odd byte
			b = make([]byte, rnd.IntN(64))
			for j := range b {
				b[j] = byte(0x20 + rnd.IntN(0x5f))
			}
			for range rnd.IntN(3) {
				if len(b) > 0 {
					b[rnd.IntN(len(b))] = alphabet[rnd.IntN(len(alphabet))]
				}
			}
			if got := isSQSText(b); got != want(b) {
				t.Fatalf("isSQSText(%q) = %v, want %v", b, got, want(b))
			}
			continue
		}
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		if got := isSQSText(b); got != want(b) {
			t.Fatalf("isSQSText(%q) = %v, want %v", b, got, want(b))
		}
	}
}
