package dashboard_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// refusingSweeper is a broker that sweeps its dead letters, as RabbitMQ
// does, and whose redrive of one letter fails (a publish the broker
// refuses): that letter stays a dead letter, named by a *sdk.PublishError.
type refusingSweeper struct {
	sdk.Broker
	sdk.Inspector
	sdk.DeadLetters
	mem    *memory.Broker
	refuse string
}

func (s *refusingSweeper) SweepDeadLetters(ctx context.Context, queue string, size int, redrive bool, fn func(int, []*sdk.Message) []bool) (int, error) {
	page, err := s.mem.ListDeadLetters(ctx, queue, 1000)
	if err != nil {
		return 0, err
	}
	chosen := fn(0, page)
	var ids []string
	failed := map[string]error{}
	for i, c := range chosen {
		switch {
		case !c:
		case page[i].ID == s.refuse:
			failed[page[i].ID] = errors.New("publish refused: queue full")
		default:
			ids = append(ids, page[i].ID)
		}
	}
	n := 0
	if len(ids) > 0 {
		if !redrive {
			n, err = s.mem.DeleteDeadLetters(ctx, queue, ids...)
		} else {
			n, err = s.mem.RedriveDeadLetters(ctx, queue, ids...)
		}
		if err != nil {
			return n, err
		}
	}
	if len(failed) > 0 {
		return n, &sdk.PublishError{Failed: failed}
	}
	return n, nil
}

// A dead letter whose redrive the broker failed is still a dead letter:
// the page must not report it "gone already", and the log names it.
func TestFailedRedriveIsNotReportedGone(t *testing.T) {
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	ids := seed(t, mem, 3, 0)
	b := &refusingSweeper{Broker: mem, Inspector: mem, DeadLetters: mem, mem: mem, refuse: ids[1]}
	logs := newSyncBuffer()
	srv := serve(t, b, dashboard.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	form := url.Values{"all": {"1"}, "limit": {"3"}}
	code, page := post(t, mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", form.Encode()))
	if code != http.StatusOK {
		t.Fatalf("redrive: %d %s", code, page)
	}
	if _, err := mem.GetDeadLetter(context.Background(), "billing", ids[1]); err != nil {
		t.Fatalf("the refused letter should still be a dead letter: %v", err)
	}
	if !strings.Contains(page, "redriven 2 dead letter(s); 1 of the chosen were not redriven") {
		t.Fatalf("flash: %s", page)
	}
	if strings.Contains(page, "(gone already)") {
		t.Errorf("the page calls a dead letter whose redrive failed gone already")
	}
	if l := logs.String(); !strings.Contains(l, ids[1]) || !strings.Contains(l, "publish refused") {
		t.Errorf("the log does not name the letter that was not redriven:\n%s", l)
	}
	// One that is not found is gone already, and said so.
	other := memoryBroker(t)
	otherIDs := seed(t, other, 1, 0)
	form = url.Values{"id": {"no-such-letter", otherIDs[0]}, "limit": {"1"}}
	code, page = post(t, mustReq("POST", serve(t, other, dashboard.Options{}).URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode()))
	if code != http.StatusOK || !strings.Contains(page, "purged 1 dead letter(s); 1 of the chosen were not purged (gone already)") {
		t.Errorf("a letter not found: %d %s", code, page)
	}
}
