package dashboard_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
)

// listsCtx is a memory broker whose queue listing honours its context, as
// a network broker's does: a request whose client went away fails there.
type listsCtx struct{ *memory.Broker }

func (b listsCtx) Queues(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return b.Broker.Queues(ctx)
}

// A request whose client went away (its context cancelled) fails, but that
// is no failure of the dashboard or its broker: it is not logged at ERROR,
// where operators' alerts look.
func TestClientGoneIsNotAnError(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var logs bytes.Buffer
	d, err := dashboard.New(listsCtx{b}, dashboard.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, path := range []string{"/", "/api/queues"} {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest("GET", path, nil).WithContext(ctx))
		if rec.Code < 400 {
			t.Errorf("%s with the client gone: %d, want a failure status", path, rec.Code)
		}
	}
	if l := logs.String(); strings.Contains(l, "level=ERROR") {
		t.Errorf("a request ended by its client logged as an error:\n%s", l)
	}
	if l := logs.String(); !strings.Contains(l, "level=DEBUG") {
		t.Errorf("a request ended by its client left no trace at DEBUG:\n%s", l)
	}
}
