package postgres_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestPoisonLogCutsMessageID: the warning of a job dead-lettered at claim
// names its message ID, the producer's text, as every berth log of a
// message field does (sdk.LogText): cut to sdk.MaxLogTextLength bytes.
// Before the fix the ID was written whole: up to MaxIndexedLength (2048)
// bytes from Publish, any length from a row written by another tool, in
// every such record.
func TestPoisonLogCutsMessageID(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "berth-poisonlog-"+suffix(), 4)
	logs := newLogRecorder()
	b := newBroker(t, pool, postgres.Options{Lease: 50 * time.Millisecond, MaxAttempts: 1,
		PollInterval: 20 * time.Millisecond, DisableListen: true, Logger: slog.New(logs)})
	q := "poisonlog_" + suffix()
	id := strings.Repeat("x", postgres.MaxIndexedLength)
	if err := b.Publish(ctx, q, &sdk.Message{ID: id, Type: "t", Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	// Not settled: its lease runs out, and the next claim finds it at its cap.
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if ds, err := b.Receive(rctx, q, 1); len(ds) != 0 {
		t.Fatalf("Receive after the cap: %d deliveries, %v", len(ds), err)
	}
	rec := waitLog(t, logs, "berth/postgres: job dead-lettered at claim: max deliveries exceeded", 10*time.Second)
	if got := attr(rec, "message_id").String(); len(got) > sdk.MaxLogTextLength || !strings.HasPrefix(got, "xxx") {
		t.Fatalf("message_id logged as %d bytes, want at most %d", len(got), sdk.MaxLogTextLength)
	}
}
