package dashboard_test

import (
	"context"
	"net/http"
	"regexp"
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
