package rabbitmq

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// lostAcks records the counts of the consume loop's "acks not yet sent"
// warnings.
type lostAcks struct {
	mu     sync.Mutex
	counts []int64
}

func (l *lostAcks) Enabled(context.Context, slog.Level) bool { return true }
func (l *lostAcks) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lostAcks) WithGroup(string) slog.Handler            { return l }
func (l *lostAcks) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "acks" {
			l.mu.Lock()
			l.counts = append(l.counts, a.Value.Int64())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *lostAcks) total() (n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.counts {
		n += c
	}
	return n
}

// TestFlushAfterChannelLossLogsLostAcks pins what Flush's doc says of acks
// a dead channel dropped: the consume loop logs them, with their count,
// when it replaces the channel, and Flush does not report them (the doc
// promised ErrLeaseLost, which made a Worker that survived the outage fail
// its Run): their messages simply come back, as after a process death
// within the ack interval.
func TestFlushAfterChannelLossLogsLostAcks(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	logs := &lostAcks{}
	b := newBroker(t, purl, Options{Prefetch: 40, AckInterval: time.Hour, Logger: slog.New(logs),
		Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 3
	publishN(t, ctx, b, q, "flushlost", n)
	old := receiveAll(t, ctx, b, q, n)
	for _, d := range old[:2] {
		if err := d.Ack(ctx); err != nil { // recorded, not sent: the interval is an hour
			t.Fatal(err)
		}
	}
	p.Cut()
	fresh := receiveAll(t, ctx, b, q, n) // all back on a new channel, the two acked included
	for logs.total() < 2 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if got := logs.total(); got != 2 {
		t.Errorf("logged %d lost acks, want 2", got)
	}
	if err := b.Flush(ctx); err != nil {
		t.Errorf("Flush after the lost acks were logged: %v, want nil (as the doc says)", err)
	}
	for _, d := range fresh {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
