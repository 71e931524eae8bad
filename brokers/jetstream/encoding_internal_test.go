package jetstream

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/internal/jsontext"
	"github.com/berthq/berth/sdk"
)

// TestAppendPlainMatchesMarshal pins the envelope's fast encoder to
// json.Marshal: where it takes a message it writes the same bytes, and it
// leaves to json.Marshal every message whose strings JSON would escape.
func TestAppendPlainMatchesMarshal(t *testing.T) {
	id := "0192b5c8-7f3a-7000-8000-000000000000"
	cases := []struct {
		env   envelope
		plain bool
	}{
		{envelope{V: 1, ID: id}, true},
		{envelope{V: 1, ID: id, T: "billing.charge"}, true},
		{envelope{V: 1, ID: id, T: "t", IK: "order-1", K: "customer 7", C: "corr", A: 3, NB: 1764567890123456789}, true},
		{envelope{V: 1, ID: id, A: -1, NB: -5}, true},
		{envelope{V: 1, ID: id, T: `a"b`}, false},
		{envelope{V: 1, ID: id, T: `a\b`}, false},
		{envelope{V: 1, ID: id, K: "<script>"}, false},
		{envelope{V: 1, ID: id, IK: "a&b"}, false},
		{envelope{V: 1, ID: id, C: "tab\there"}, false},
		{envelope{V: 1, ID: "é"}, false},
		{envelope{V: 1, ID: "a\u2028b"}, false},
		{envelope{V: 1, ID: id, T: "x\x7f"}, false},
		{envelope{V: 1, ID: id, H: map[string]string{"k": "v"}}, false},
	}
	for _, c := range cases {
		check(t, c.env, c.plain)
	}
	// Random strings over an alphabet with every kind of byte.
	alphabet := []byte("aZ09 -_.:/~!#$%'()*+,;=?@[]^`{|}\"\\<>&\x00\x1f\x7f\xc3\xa9")
	r := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		b := make([]byte, r.IntN(6))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 5000 {
		env := envelope{V: 1, ID: str(), T: str(), IK: str(), K: str(), C: str(), A: r.IntN(3), NB: r.Int64N(3)}
		check(t, env, jsontext.Plain(env.ID) && jsontext.Plain(env.T) && jsontext.Plain(env.IK) && jsontext.Plain(env.K) && jsontext.Plain(env.C))
	}
}

func check(t *testing.T, env envelope, plain bool) {
	t.Helper()
	got, ok := appendPlain(nil, &env)
	if ok != plain {
		t.Errorf("appendPlain(%+v) took it: %v, want %v", env, ok, plain)
		return
	}
	if !ok {
		return
	}
	want, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("appendPlain(%+v) = %s, json.Marshal = %s", env, got, want)
	}
}

// A header deleted from the Message before a copy is made (by a handler
// before Release, by PrepareRedrive's reserved berth- names, by DeadLetter)
// stays deleted on the copy: the foreign NATS headers a copy carries as
// they were are only those the Message still has.
func TestDeletedForeignHeaderStaysDeleted(t *testing.T) {
	h := nats.Header{}
	h.Set("X-App", "1")
	h.Set(sdk.HeaderDeadLetterReason, "forged")
	h.Set("X-Drop", "x")
	dec, err := decode(h, []byte("b"), "S", 7, time.Unix(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	m := dec.msg.Clone()
	sdk.PrepareRedrive(m, "q")
	delete(m.Headers, "X-Drop")
	w, err := encode(m, dec.extra, "subj", 1, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode(w.Header, w.Data, "S", 8, time.Unix(0, 2))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{sdk.HeaderDeadLetterReason, "X-Drop"} {
		if v, ok := got.msg.Headers[k]; ok {
			t.Errorf("header %q deleted from the Message came back on the copy: %q", k, v)
		}
	}
	if got.msg.Headers["X-App"] != "1" {
		t.Errorf("X-App = %q on the copy, want 1 kept", got.msg.Headers["X-App"])
	}
}
