package dashboard_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// stoppedGet is a memory broker whose GetDeadLetter ends as an SQS scan
// that could not see every dead letter does (letters held invisible by
// another reader, or queued in a FIFO group behind those the scan held):
// with a *sqs.ScanError, neither found nor known to be missing.
type stoppedGet struct{ *memory.Broker }

func (b stoppedGet) GetDeadLetter(_ context.Context, queue, _ string) (*sdk.Message, error) {
	return nil, &sqs.ScanError{Queue: queue, Remaining: 3,
		Reason: "3 dead letters were held invisible by another reader (a listing, another redrive)"}
}

// A dead letter's page and API answer whose broker scan stopped before the
// end were a 500 logged at ERROR as "request failed", as if the dashboard
// or the broker had failed. The scan's stop is a partial answer, as it is
// in a listing or a change (Incomplete): 503 (try again), with the
// reason shown escaped, logged at WARN.
func TestDeadLetterScanStopIsUnavailableNotFailure(t *testing.T) {
	mb, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	logs := newSyncBuffer()
	srv := serve(t, stoppedGet{mb}, dashboard.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	id := "dl\u202e<b>x"
	for _, path := range []string{
		"/queues/billing/messages/" + url.PathEscape(id),
		"/api/queues/billing/dead-letters/" + url.PathEscape(id),
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s: status %d, want 503:\n%s", path, resp.StatusCode, body)
		}
		page := string(body)
		if !strings.Contains(page, "held invisible by another reader") || !strings.Contains(page, "try again") {
			t.Errorf("%s: the answer does not give the scan's reason and what to do:\n%s", path, page)
		}
		if strings.Contains(page, "\u202e") || strings.Contains(page, "<b>") {
			t.Errorf("%s: the ID is shown unescaped:\n%q", path, page)
		}
	}
	l := logs.String()
	if strings.Contains(l, "level=ERROR") {
		t.Errorf("a scan that stopped before the end was logged as an error:\n%s", l)
	}
	if !strings.Contains(l, "level=WARN") {
		t.Errorf("a scan that stopped before the end left no warning:\n%s", l)
	}
}
