package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// emptyID is a memory broker whose dead letter hidden has the empty ID, as
// a RabbitMQ message published without a message-id by a producer outside
// berth has.
type emptyID struct {
	*memory.Broker
	hidden string
}

func (b emptyID) show(ms []*sdk.Message) {
	for _, m := range ms {
		if m.ID == b.hidden {
			m.ID = ""
		}
	}
}

func (b emptyID) DeadLetterPage(ctx context.Context, q, cursor string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPage(ctx, q, cursor, limit)
	b.show(ms)
	return ms, next, err
}

func (b emptyID) DeadLetterPageTo(ctx context.Context, q, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPageTo(ctx, q, cursor, mark, limit)
	b.show(ms)
	return ms, next, err
}

func (b emptyID) GetDeadLetter(ctx context.Context, q, id string) (*sdk.Message, error) {
	if id == "" {
		id = b.hidden
	}
	m, err := b.Broker.GetDeadLetter(ctx, q, id)
	if err == nil {
		b.show([]*sdk.Message{m})
	}
	return m, err
}

// A dead letter with the empty ID is linked from its queue's page (and the
// API's listing) to a page that shows it, not to a path no route matches.
func TestEmptyIDLinks(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ids := seed(t, mb, 1, 0)
	srv := serve(t, emptyID{mb, ids[0]}, dashboard.Options{})
	_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	links := regexp.MustCompile(`<td class="mono"><a href="([^"]*)">`).FindAllStringSubmatch(page, -1)
	if len(links) != 1 {
		t.Fatalf("%d links, want 1:\n%s", len(links), page)
	}
	link := strings.ReplaceAll(links[0][1], "&amp;", "&")
	if code, page := get(t, http.DefaultClient, srv.URL+link); code != 200 || !strings.Contains(page, `id="body"`) {
		t.Fatalf("GET %s: %d %s", link, code, page)
	}
	_, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters")
	u := regexp.MustCompile(`"url":"([^"]*)"`).FindStringSubmatch(body)
	if u == nil {
		t.Fatalf("listing without url: %s", body)
	}
	if code, doc := get(t, http.DefaultClient, srv.URL+u[1]); code != 200 || !strings.Contains(doc, `"body"`) {
		t.Fatalf("GET %s: %d %s", u[1], code, doc)
	}
}

// sharedEmptyID is a memory broker whose dead letters hidden all have the
// empty ID, as RabbitMQ messages a producer outside berth published without
// a message-id have. Its redrive and delete of the empty ID move every one
// of them, as a broker does for letters sharing an ID (RabbitMQ, memory,
// SQS): it cannot tell them apart.
type sharedEmptyID struct {
	*memory.Broker
	hidden []string
}

func (b sharedEmptyID) show(ms []*sdk.Message) {
	for _, m := range ms {
		if slices.Contains(b.hidden, m.ID) {
			m.ID = ""
		}
	}
}

// held is the hidden letters the broker still holds.
func (b sharedEmptyID) held(ctx context.Context, q string) []string {
	var out []string
	for _, id := range b.hidden {
		if _, err := b.Broker.GetDeadLetter(ctx, q, id); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// inner is ids with the empty ID as every hidden letter still held.
func (b sharedEmptyID) inner(ctx context.Context, q string, ids []string) []string {
	var out []string
	for _, id := range ids {
		if id == "" {
			out = append(out, b.held(ctx, q)...)
			continue
		}
		out = append(out, id)
	}
	if len(out) == 0 && len(ids) > 0 {
		out = []string{"no such letter"} // the empty ID when none holds it: not found
	}
	return out
}

func (b sharedEmptyID) ListDeadLetters(ctx context.Context, q string, limit int) ([]*sdk.Message, error) {
	ms, err := b.Broker.ListDeadLetters(ctx, q, limit)
	b.show(ms)
	return ms, err
}

func (b sharedEmptyID) DeadLetterPage(ctx context.Context, q, cursor string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPage(ctx, q, cursor, limit)
	b.show(ms)
	return ms, next, err
}

func (b sharedEmptyID) DeadLetterPageTo(ctx context.Context, q, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := b.Broker.DeadLetterPageTo(ctx, q, cursor, mark, limit)
	b.show(ms)
	return ms, next, err
}

func (b sharedEmptyID) GetDeadLetter(ctx context.Context, q, id string) (*sdk.Message, error) {
	if id == "" {
		if held := b.held(ctx, q); len(held) > 0 {
			id = held[0]
		}
	}
	m, err := b.Broker.GetDeadLetter(ctx, q, id)
	if err == nil {
		b.show([]*sdk.Message{m})
	}
	return m, err
}

func (b sharedEmptyID) CountDeadLetters(ctx context.Context, q, id string) (int, error) {
	if id == "" {
		return len(b.held(ctx, q)), nil
	}
	return b.Broker.CountDeadLetters(ctx, q, id)
}

func (b sharedEmptyID) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	return b.Broker.RedriveDeadLetters(ctx, q, b.inner(ctx, q, ids)...)
}

func (b sharedEmptyID) DeleteDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	return b.Broker.DeleteDeadLetters(ctx, q, b.inner(ctx, q, ids)...)
}

// sweptEmptyID is sharedEmptyID as RabbitMQ offers it: without a cursor
// (no dlq.Pager), its dead letters swept once round and chosen one by one
// by their place in a page (dlq.Sweeper).
type sweptEmptyID struct {
	sdk.Broker
	sdk.Inspector
	sdk.DeadLetters
	s sharedEmptyID
}

func (b sweptEmptyID) SweepDeadLetters(ctx context.Context, q string, size int, redrive bool, fn func(int, []*sdk.Message) []bool) (int, error) {
	real, err := b.s.Broker.ListDeadLetters(ctx, q, 1000)
	if err != nil {
		return 0, err
	}
	page, err := b.s.ListDeadLetters(ctx, q, 1000) // as shown: the same letters, in the same order
	if err != nil {
		return 0, err
	}
	var ids []string
	for i, c := range fn(0, page) {
		if c {
			ids = append(ids, real[i].ID)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if redrive {
		return b.s.Broker.RedriveDeadLetters(ctx, q, ids...)
	}
	return b.s.Broker.DeleteDeadLetters(ctx, q, ids...)
}

// Choosing one of several dead letters that share the empty ID (RabbitMQ
// messages published without a message-id) chooses them all: no broker
// call can address one of them alone. The confirmation says so, and its
// count is that of every letter the change touches; the change then does
// what it said. Before, on a broker the dashboard asks for each chosen ID
// (a dlq.Pager), the confirmation counted 1 and the purge deleted 3; on one
// that sweeps (RabbitMQ) it counted 3 without a word on why 3 when one was
// ticked.
func TestOneOfSharedEmptyIDIsConfirmedWithTheTrueCount(t *testing.T) {
	for _, sweeps := range []bool{false, true} {
		t.Run(fmt.Sprintf("sweeps=%v", sweeps), func(t *testing.T) {
			mb, _ := memory.New(memory.Options{})
			t.Cleanup(func() { mb.Close() })
			ids := seed(t, mb, 5, 0)
			s := sharedEmptyID{mb, ids[:3]}
			var b broker = s
			if sweeps {
				b = sweptEmptyID{s, s, s, s}
			}
			srv := serve(t, b, dashboard.Options{})
			_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
			boxes := regexp.MustCompile(`<input type="checkbox" name="id" value="">`).FindAllString(page, -1)
			if len(boxes) != 3 {
				t.Fatalf("%d checkboxes of the empty ID, want 3:\n%s", len(boxes), page)
			}
			// One of them ticked, and Purge.
			code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=purge&id=")
			if code != 200 {
				t.Fatalf("confirm: %d %s", code, page)
			}
			if !strings.Contains(page, `<span id="confirm-count">3</span>`) {
				t.Errorf("the confirmation does not count the 3 letters the purge deletes:\n%s", page)
			}
			if !regexp.MustCompile(`id="shared-id">3 of them have the empty ID`).MatchString(page) {
				t.Errorf("the confirmation does not say the 3 letters share the empty ID:\n%s", page)
			}
			limit := regexp.MustCompile(`name="limit" value="(\d+)"`).FindStringSubmatch(page)
			if limit == nil {
				t.Fatalf("no limit in the form:\n%s", page)
			}
			form := url.Values{"id": {""}, "limit": {limit[1]}}
			code, page = post(t, mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode()))
			if code != 200 || !strings.Contains(page, "purged 3 dead letter(s)<") {
				t.Errorf("purge: %d, the flash does not say purged 3:\n%s", code, page)
			}
			if st := stats(t, mb); st.DeadLettered != 2 {
				t.Errorf("%d dead letters left, want 2 (those with their own IDs)", st.DeadLettered)
			}
		})
	}
}
