package jetstream

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
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
		check(t, env, plainJSON(env.ID) && plainJSON(env.T) && plainJSON(env.IK) && plainJSON(env.K) && plainJSON(env.C))
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
