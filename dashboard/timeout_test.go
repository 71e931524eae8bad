package dashboard_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// hanging is a broker that does not answer: its reads wait until their
// context ends, as a network broker's do when its server is gone without a
// word (a dropped route, a stopped VM).
type hanging struct {
	sdk.Broker
	sdk.DeadLetters
}

func (hanging) Queues(ctx context.Context) ([]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hanging) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	<-ctx.Done()
	return sdk.QueueStats{}, ctx.Err()
}

func (hanging) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hanging) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A broker that does not answer gives each read a clear 503 within
// Options.Timeout, logged as an error, instead of a page that hangs for as
// long as the browser waits (and, with the overview's refresh every 2 s,
// takes every connection the browser has to the dashboard). Before, a read
// waited on the broker without a bound.
func TestBrokerThatDoesNotAnswerFailsInTime(t *testing.T) {
	b := memoryBroker(t)
	var logs bytes.Buffer
	d, err := dashboard.New(hanging{Broker: b, DeadLetters: b}, dashboard.Options{
		Timeout: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/api/queues", "/queues/billing", "/api/queues/billing/dead-letters",
		"/queues/billing/messages/m1", "/api/queues/billing/dead-letters/m1", "/queues/billing/confirm?action=purge&all=1"} {
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // far past the 20ms bound: the request hangs
			t.Fatalf("%s: no answer while the broker does not answer", path)
		}
		if rec.Code != 503 || !strings.Contains(rec.Body.String(), "did not answer within 20ms") {
			t.Errorf("%s: %d %s, want 503 saying the broker did not answer", path, rec.Code, rec.Body)
		}
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") {
		t.Errorf("a broker that does not answer left no error in the log:\n%s", l)
	}
}
