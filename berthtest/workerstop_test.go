package berthtest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// TestWaitFailsWhenTheWorkerStopped: a Worker of StartWorker whose Run
// returned during the test (a closed broker, a queue that does not exist)
// settles nothing more: the recorder's waits fail at once, with Run's
// error, rather than wait out their timeout and leave the cause to the
// test's cleanup. Before, Wait waited its whole timeout (30s by default)
// and said only "timed out".
func TestWaitFailsWhenTheWorkerStopped(t *testing.T) {
	b := berthtest.Memory(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	tb := &ctxT{TB: t, ctx: t.Context()} // records the cleanup's report of Run's error
	t.Cleanup(func() {
		// Registered before StartWorker's cleanup: runs after it, which
		// still reports Run's error.
		if e := tb.errors(); !strings.Contains(e, sdk.ErrClosed.Error()) {
			t.Errorf("cleanup did not report Run's error: %q", e)
		}
	})
	rec := berthtest.StartWorker(tb, b, handler(nil), sdk.WorkerOptions{Queue: "q"})
	rec.SetWaitTimeout(time.Hour) // not reached: the wait must end with the Worker
	done := make(chan string, 1)
	go func() { done <- fatalMessage(t, func(tb testing.TB) { rec.Wait(tb, 1) }) }()
	var msg string
	select {
	case msg = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Wait still waiting for a Worker that had stopped")
	}
	if !strings.Contains(msg, "stopped") || !strings.Contains(msg, sdk.ErrClosed.Error()) {
		t.Errorf("Wait failed with %q, want it to say the Worker stopped, and why", msg)
	}
}
