package sdk_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// TestHandlerGoexitSettledAndReplaced: a handler that calls runtime.Goexit
// (directly or in a library) ends its goroutine, and recover sees nothing.
// The delivery was left unsettled, its slot held and the Worker one handler
// goroutine short for good: with Concurrency 1 nothing more ran. Now the
// delivery is retried as a panic ([sdk.ErrGoexit] in a *PanicError), logged
// once at ERROR, and a new goroutine runs the next jobs.
func TestHandlerGoexitSettledAndReplaced(t *testing.T) {
	sub := newFakeSub()
	logs := &logRecords{}
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		if d.Message().Type == "exit" {
			runtime.Goexit()
		}
		return nil
	})
	rec := berthtest.NewRecorder()
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(logs), Observers: []sdk.Observer{rec}})
	jobs := []*berthtest.Delivery{newFake(1, "exit"), newFake(1, "ok"), newFake(1, "exit"), newFake(1, "ok")}
	for _, f := range jobs {
		sub.ch <- f
		f.Wait(t)
	}
	records := rec.Wait(t, len(jobs))
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	for i, want := range []string{"retry", "ack", "retry", "ack"} {
		if a := actions(jobs[i]); len(a) != 1 || a[0] != want {
			t.Errorf("job %d settled %v, want [%s] once", i, a, want)
		}
	}
	for _, r := range records {
		if r.Message.Type != "exit" {
			continue
		}
		var pe *sdk.PanicError
		if !errors.As(r.Cause, &pe) || !errors.Is(r.Cause, sdk.ErrGoexit) || r.Class != sdk.ClassPanic || r.Action != sdk.ActionRetry {
			t.Errorf("Goexit settled as %s, class %s, cause %v; want a retry of a *PanicError wrapping ErrGoexit, ClassPanic", r.Action, r.Class, r.Cause)
		}
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	var logged int
	for _, m := range logs.recs {
		if strings.Contains(m["msg"], "Goexit") {
			logged++
		}
	}
	if logged != 2 || len(logs.recs) != 2 {
		t.Errorf("%d Goexit records among %d at ERROR, want one per Goexit (2): %v", logged, len(logs.recs), logs.recs)
	}
}
