package sqs

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

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
