package dashboard_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// A listing of the API carries the first bytes of each body (cut between
// characters), the body's whole size and whether it was cut, and the path
// of the dead letter, whose document gives the whole body. Before, a
// listing carried every body whole: a page of 100 dead letters of 256 KiB
// was a 25 MB answer, built in memory for each request.
func TestAPIListCarriesBodyPreview(t *testing.T) {
	const size = 256 << 10
	b, err := memory.New(memory.Options{MaxMessageSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	bodies := map[string][]byte{}
	publish := func(id string, body []byte) {
		t.Helper()
		deadLetterOne(t, b, &sdk.Message{ID: id, Type: "big", Body: body})
		bodies[id] = body
	}
	// "€" is 3 bytes: a cut at a round number of bytes falls inside one.
	publish("euro", bytes.Repeat([]byte("€"), size/3))
	publish("binary", bytes.Repeat([]byte{0xff, 0x00, 0x41}, size/3))
	// Text that is UTF-8 at the start and not further on is not text.
	publish("late binary", append(bytes.Repeat([]byte("a"), size), 0xff))
	// Characters that act on a terminal are still \u escapes, cut or not.
	publish("controls", bytes.Repeat([]byte("\u202e\u009b\x7f<"), size/8))
	publish("dot", bytes.Repeat([]byte("."), size)) // see below: ".." as ID
	publish("..", bytes.Repeat([]byte("x"), size))  // its URL is by query
	publish("short", []byte(`{"order":"o-1"}`))
	for i := range 20 {
		publish("filler "+string(rune('a'+i)), bytes.Repeat([]byte("f"), size))
	}
	total := 0
	for _, body := range bodies {
		total += len(body)
	}

	srv := serve(t, b, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters?limit=100")
	if code != 200 {
		t.Fatalf("list: %d %.500s", code, page)
	}
	// 27 previews of at most 4 KiB, each byte at most a 6-byte \u escape.
	if len(page) > 27*6*4096+64<<10 {
		t.Errorf("a listing of %d bytes of bodies is %d bytes", total, len(page))
	}
	for _, raw := range []string{"\u202e", "\u009b", "\x7f"} {
		if strings.Contains(page, raw) {
			t.Errorf("the listing has %q raw", raw)
		}
	}
	type message struct {
		ID           string `json:"id"`
		Body         string `json:"body"`
		BodyEncoding string `json:"body_encoding"`
		BodySize     *int   `json:"body_size"`
		BodyCut      bool   `json:"body_cut"`
		URL          string `json:"url"`
	}
	var l struct {
		Messages []message `json:"messages"`
	}
	if err := json.Unmarshal([]byte(page), &l); err != nil {
		t.Fatalf("list: not JSON: %v", err)
	}
	if len(l.Messages) != len(bodies) {
		t.Fatalf("list: %d dead letters, want %d", len(l.Messages), len(bodies))
	}
	decode := func(m message) []byte {
		t.Helper()
		switch m.BodyEncoding {
		case "text":
			return []byte(m.Body)
		case "base64":
			b, err := base64.StdEncoding.DecodeString(m.Body)
			if err != nil {
				t.Fatalf("%s: %v", m.ID, err)
			}
			return b
		}
		t.Fatalf("%s: body_encoding %q", m.ID, m.BodyEncoding)
		return nil
	}
	for _, m := range l.Messages {
		whole := bodies[m.ID]
		got := decode(m)
		switch {
		case m.BodySize == nil || *m.BodySize != len(whole):
			t.Errorf("%s: body_size %v, want %d", m.ID, m.BodySize, len(whole))
		case m.BodyCut != (len(whole) > 4096):
			t.Errorf("%s: body_cut %v for a body of %d bytes", m.ID, m.BodyCut, len(whole))
		case !bytes.HasPrefix(whole, got):
			t.Errorf("%s: the preview is not the body's start: %.40q", m.ID, got)
		case len(got) > 4096 || m.BodyCut && len(got) < 4096-utf8.UTFMax:
			t.Errorf("%s: a preview of %d bytes", m.ID, len(got))
		case !m.BodyCut && len(got) != len(whole):
			t.Errorf("%s: not cut, yet %d of %d bytes", m.ID, len(got), len(whole))
		}
		if wantText := utf8.Valid(whole); wantText != (m.BodyEncoding == "text") || wantText && !utf8.Valid(got) {
			t.Errorf("%s: the preview is %s, of a body that is UTF-8: %v", m.ID, m.BodyEncoding, wantText)
		}
		// The dead letter's own document gives the whole body.
		code, one := get(t, http.DefaultClient, srv.URL+m.URL)
		var full message
		if code != 200 || json.Unmarshal([]byte(one), &full) != nil || full.ID != m.ID {
			t.Fatalf("%s: %q: %d %.300s", m.ID, m.URL, code, one)
		}
		if !bytes.Equal(decode(full), whole) || full.BodyCut || full.BodySize == nil || *full.BodySize != len(whole) {
			t.Errorf("%s: %q gives %d of the body's %d bytes (cut %v, size %v)", m.ID, m.URL, len(decode(full)), len(whole), full.BodyCut, full.BodySize)
		}
	}
}

// A listing cuts every field but the ID and the body to 1 KiB too (header
// values and names, the type, the keys, the dead-letter history read from
// headers a foreign producer forged) and says so in fields_cut; the dead letter's document
// keeps them whole. A producer outside berth may write 64 KiB headers, and a
// page of 1,000 dead letters carried them all.
func TestAPIListCutsLongFields(t *testing.T) {
	b, err := memory.New(memory.Options{MaxMessageSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	huge := strings.Repeat("€", 64<<10/3) // 3 bytes each: a cut falls inside one
	m := &sdk.Message{ID: "forged", Type: "t" + huge, CorrelationID: "c" + huge, Key: "k" + huge, Body: []byte("{}"),
		Headers: map[string]string{"tenant": "v" + huge, "h" + huge: "x", "short": "kept"}}
	deadLetterOne(t, b, m)
	deadLetterOne(t, b, &sdk.Message{ID: "plain", Type: "order", Body: []byte("{}"), Headers: map[string]string{"tenant": "acme"}})

	type message struct {
		ID            string            `json:"id"`
		Type          string            `json:"type"`
		Key           string            `json:"key"`
		CorrelationID string            `json:"correlation_id"`
		Headers       map[string]string `json:"headers"`
		FieldsCut     bool              `json:"fields_cut"`
		URL           string            `json:"url"`
	}
	srv := serve(t, b, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters")
	var l struct {
		Messages []message `json:"messages"`
	}
	if code != 200 || json.Unmarshal([]byte(page), &l) != nil || len(l.Messages) != 2 {
		t.Fatalf("list: %d %.300s", code, page)
	}
	if len(page) > 64<<10 {
		t.Errorf("a listing of two dead letters is %d bytes", len(page))
	}
	const limit = 1<<10 + len("…")
	for _, v := range l.Messages {
		if v.ID == "plain" {
			if v.FieldsCut || v.Type != "order" || v.Headers["tenant"] != "acme" {
				t.Errorf("plain: %+v, want it whole and fields_cut false", v)
			}
			continue
		}
		if !v.FieldsCut {
			t.Errorf("forged: fields_cut false")
		}
		fields := map[string]string{"type": v.Type, "key": v.Key, "correlation_id": v.CorrelationID}
		for k, val := range v.Headers {
			fields["header name "+k[:min(len(k), 8)]] = k
			fields["header "+k[:min(len(k), 8)]] = val
		}
		for name, val := range fields {
			if len(val) > limit || !utf8.ValidString(val) {
				t.Errorf("forged: %s of %d bytes (valid UTF-8 %v), want at most %d", name, len(val), utf8.ValidString(val), limit)
			}
		}
		if v.Headers["short"] != "kept" || !strings.HasPrefix(v.Headers["tenant"], "v€") {
			t.Errorf("forged: headers %.200v", v.Headers)
		}
		code, one := get(t, http.DefaultClient, srv.URL+v.URL)
		var full message
		if code != 200 || json.Unmarshal([]byte(one), &full) != nil {
			t.Fatalf("%s: %d %.200s", v.URL, code, one)
		}
		if full.FieldsCut || full.Type != m.Type || full.Headers["tenant"] != m.Headers["tenant"] || full.Key != m.Key {
			t.Errorf("the document does not keep the fields whole (fields_cut %v, type of %d bytes)", full.FieldsCut, len(full.Type))
		}
	}
}
