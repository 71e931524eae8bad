package dashboard_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// rawIDs is a memory broker whose dead letters have IDs that are not UTF-8
// and hold a line break, as a raw AMQP message-id from a producer outside
// berth may: each is the memory broker's ID after rawPrefix.
type rawIDs struct{ *memory.Broker }

const rawPrefix = "\xff\n"

func (b rawIDs) inner(ids []string) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		in, ok := strings.CutPrefix(id, rawPrefix)
		if !ok {
			return nil, fmt.Errorf("dead letter %q: %w", id, sdk.ErrNotFound)
		}
		out[i] = in
	}
	return out, nil
}

func (b rawIDs) DeadLetterPage(ctx context.Context, q, cursor string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPage(ctx, q, cursor, limit)
	for _, m := range ms {
		m.ID = rawPrefix + m.ID
	}
	return ms, next, err
}

func (b rawIDs) DeadLetterPageTo(ctx context.Context, q, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPageTo(ctx, q, cursor, mark, limit)
	for _, m := range ms {
		m.ID = rawPrefix + m.ID
	}
	return ms, next, err
}

func (b rawIDs) GetDeadLetter(ctx context.Context, q, id string) (*sdk.Message, error) {
	in, err := b.inner([]string{id})
	if err != nil {
		return nil, err
	}
	m, err := b.Broker.GetDeadLetter(ctx, q, in[0])
	if err == nil {
		m.ID = id
	}
	return m, err
}

func (b rawIDs) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	in, err := b.inner(ids)
	if err != nil {
		return 0, err
	}
	return b.Broker.RedriveDeadLetters(ctx, q, in...)
}

func (b rawIDs) DeleteDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	in, err := b.inner(ids)
	if err != nil {
		return 0, err
	}
	return b.Broker.DeleteDeadLetters(ctx, q, in...)
}

// A dead letter whose ID a browser cannot send back as it is (not UTF-8,
// a line break) can be chosen on the queue page, confirmed and redriven;
// and the API, which lists it with id_base64, purges it by that.
func TestRawIDsRoundTrip(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ids := seed(t, mb, 2, 0)
	srv := serve(t, rawIDs{mb}, dashboard.Options{})
	_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	boxes := regexp.MustCompile(`<input type="checkbox" name="([^"]*)" value="([^"]*)">`).FindAllStringSubmatch(page, -1)
	if len(boxes) != 2 {
		t.Fatalf("%d checkboxes, want 2", len(boxes))
	}
	// What a browser submits for the first box (its name and value, as the
	// HTML parser reads them), as the confirmation form's GET does.
	form := url.Values{"action": {"redrive"}}
	name, value := html.UnescapeString(boxes[0][1]), html.UnescapeString(boxes[0][2])
	value = strings.ToValidUTF8(strings.ReplaceAll(value, "\n", "\r\n"), "\uFFFD")
	form.Add(name, value)
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?"+form.Encode())
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">1</span>`) || strings.Contains(page, "no longer dead letters") {
		t.Fatalf("confirm of %s=%q: %d %s", name, value, code, page)
	}
	hidden := regexp.MustCompile(`<input type="hidden" name="(id[0-9]*)" value="([^"]*)">`).FindAllStringSubmatch(page, -1)
	vals := url.Values{"limit": {"1"}}
	for _, h := range hidden {
		vals.Add(h[1], strings.ToValidUTF8(html.UnescapeString(h[2]), "\uFFFD"))
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", vals.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "result=") {
		t.Fatalf("redrive of %v: %d %s", vals, resp.StatusCode, loc)
	}
	if _, page := get(t, http.DefaultClient, srv.URL+loc); !strings.Contains(page, "redriven 1 dead letter(s)<") {
		t.Fatalf("redrive of %v: the page it redirects to does not say redriven 1:\n%s", vals, page)
	}
	if st := stats(t, mb); st.DeadLettered != 1 || st.Ready != 1 {
		t.Fatalf("after the redrive: %+v", st)
	}

	_, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters")
	var l struct {
		Messages []struct {
			IDBase64 string `json:"id_base64"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(body), &l); err != nil || len(l.Messages) != 1 || l.Messages[0].IDBase64 != base64.StdEncoding.EncodeToString([]byte(rawPrefix+ids[1])) {
		t.Fatalf("listing: %s", body)
	}
	code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"ids_base64":["`+l.Messages[0].IDBase64+`"]}`))
	if code != 200 || !strings.Contains(body, `"done":1`) || stats(t, mb).DeadLettered != 0 {
		t.Fatalf("purge by id_base64: %d %s", code, body)
	}
}
