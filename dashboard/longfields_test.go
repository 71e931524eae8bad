package dashboard_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// forgedFields is a memory broker whose dead letter "big" comes with every
// field a producer outside berth (or a forged header) sets at a megabyte:
// its ID, type, keys, correlation ID, and the failure-history headers
// (reason, on many lines; class; failure times).
type forgedFields struct{ *memory.Broker }

const mib = 1 << 20

func (b forgedFields) GetDeadLetter(ctx context.Context, q, id string) (*sdk.Message, error) {
	m, err := b.Broker.GetDeadLetter(ctx, q, id)
	if err != nil || id != "big" {
		return m, err
	}
	m.ID = "i" + strings.Repeat("<", mib)
	m.Type = "t" + strings.Repeat("<", mib)
	m.IdempotencyKey = "k" + strings.Repeat("<", mib)
	m.Key = "o" + strings.Repeat("<", mib)
	m.CorrelationID = "c" + strings.Repeat("<", mib)
	m.SetHeader(sdk.HeaderDeadLetterReason, "r"+strings.Repeat("<\n", mib/2))
	m.SetHeader(sdk.HeaderDeadLetterClass, "x"+strings.Repeat("<", mib))
	m.SetHeader(sdk.HeaderFirstFailure, "f"+strings.Repeat("<", mib))
	m.SetHeader(sdk.HeaderLastFailure, "l"+strings.Repeat("<", mib))
	return m, nil
}

// A dead letter's page shows its ID, type, keys, correlation ID and failure
// history cut, as it shows its headers, and says so. Before, they were
// shown whole: a page of over 30 MB (each "<" as "&lt;", the ID three
// times) for a dead letter of 9 MB of fields.
func TestLongFieldsAreShownCut(t *testing.T) {
	b, err := memory.New(memory.Options{MaxMessageSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	deadLetterOne(t, b, &sdk.Message{ID: "big", Type: "t", Body: []byte("{}")})
	d, err := dashboard.New(forgedFields{b}, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/queues/billing/messages/big", nil))
	page := rec.Body.String()
	if rec.Code != 200 {
		t.Fatalf("%d %.500s", rec.Code, page)
	}
	if len(page) > 200<<10 {
		t.Errorf("the page of a dead letter with megabyte fields is %d bytes", len(page))
	}
	for _, c := range []struct{ name, start string }{
		{"ID", `<h1 class="mono">i&lt;`},
		{"type", `<th>Type</th><td>t&lt;`},
		{"idempotency key", `<th>Idempotency key</th><td class="mono">k&lt;`},
		{"key", `<th>Key</th><td class="mono">o&lt;`},
		{"correlation ID", `<th>Correlation ID</th><td class="mono">c&lt;`},
		{"reason", `<td class="reason" id="reason">r&lt;`},
		{"class", `<th>Class</th><td>x&lt;`},
		{"first failure", `<th>First failure</th><td class="mono">f&lt;`},
		{"last failure", `<th>Last failure</th><td class="mono">l&lt;`},
	} {
		_, rest, ok := strings.Cut(page, c.start)
		if !ok {
			t.Errorf("%s not shown", c.name)
			continue
		}
		cell, _, _ := strings.Cut(rest, "</")
		if !strings.HasSuffix(cell, "…") || len(cell) > 20<<10 {
			t.Errorf("%s shown uncut (%d bytes): %.80s…%.20s", c.name, len(cell), cell, cell[max(len(cell)-20, 0):])
		}
	}
	if note := section(page, "fields-cut", "</p>"); !strings.Contains(note, "cut") {
		t.Errorf("no note that fields were cut:\n%.2000s", page)
	}

	// A dead letter with short fields is shown whole, without a note.
	deadLetterOne(t, b, &sdk.Message{ID: "few", Type: "order.paid", Key: "acme", Body: []byte("{}")})
	rec = httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/queues/billing/messages/few", nil))
	page = rec.Body.String()
	if strings.Contains(page, `id="fields-cut"`) || !strings.Contains(page, `<h1 class="mono">few</h1>`) ||
		!strings.Contains(page, `<th>Type</th><td>order.paid</td>`) || !strings.Contains(page, `<th>Key</th><td class="mono">acme</td>`) {
		t.Errorf("the fields of a small dead letter are not shown whole, or said cut:\n%s", page)
	}
}
