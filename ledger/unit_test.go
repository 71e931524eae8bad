package ledger_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// capture is a Store that keeps what it is given, for the failure paths no
// real database produces on demand (a writer stuck for as long as the test
// wants, a refused batch).
type capture struct {
	mu      sync.Mutex
	events  []ledger.Event
	gate    chan struct{} // Write waits for it to close, when set
	failing bool
}

func (c *capture) Write(ctx context.Context, batch []ledger.Event) error {
	if c.gate != nil {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing {
		return errors.New("database unreachable")
	}
	c.events = append(c.events, batch...)
	return nil
}

func (c *capture) all() []ledger.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ledger.Event(nil), c.events...)
}

func TestNewValidates(t *testing.T) {
	for _, o := range []ledger.Options{{}, {Store: &capture{}, Buffer: -1}, {Store: &capture{}, BatchSize: -1}, {Store: &capture{}, Writers: -1}} {
		if _, err := ledger.New(o); !errors.Is(err, ledger.ErrInvalidOptions) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
}

// TestFullBufferDropsAndCounts: with the writer stuck, recording fills the
// buffer, waits BlockTimeout per event, then drops and counts; nothing
// blocks for good, and every event is accounted for once the writer
// recovers.
func TestFullBufferDropsAndCounts(t *testing.T) {
	c := &capture{gate: make(chan struct{})}
	l := newLedger(t, c, ledger.Options{Buffer: 8, BatchSize: 4, BlockTimeout: time.Millisecond})
	for i := range 100 {
		l.Record(ledger.Event{MessageID: "m" + string(rune('a'+i%26)), Status: ledger.StatusEnqueued, At: time.Now()})
	}
	s := l.Stats()
	if s.Recorded != 100 || s.Dropped == 0 || s.Dropped > 100-8 {
		t.Fatalf("stats %+v: want 100 recorded and some (not all) dropped", s)
	}
	close(c.gate)
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	s = l.Stats()
	if s.Written+s.Dropped != 100 || s.Failed != 0 || int64(len(c.all())) != s.Written {
		t.Errorf("stats %+v, store got %d: written + dropped must be 100", s, len(c.all()))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := l.Flush(context.Background()); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Flush after Close = %v, want ErrClosed", err)
	}
	l.Record(ledger.Event{MessageID: "late", Status: ledger.StatusEnqueued})
	if s := l.Stats(); s.Dropped != 100-s.Written+1 {
		t.Errorf("an event recorded after Close must be dropped and counted: %+v", s)
	}
}

func TestFailedWritesAreCounted(t *testing.T) {
	c := &capture{failing: true}
	l := newLedger(t, c, ledger.Options{})
	for range 10 {
		l.Record(ledger.Event{MessageID: "m", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Failed != 10 || s.Written != 0 || s.Batches != 0 {
		t.Errorf("stats %+v, want 10 failed", s)
	}
}

// partial is a publisher that refuses one message of each batch.
type partial struct{ refuse string }

func (p partial) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, queue, msgs, 0); err != nil {
		return err
	}
	return &sdk.PublishError{Failed: map[string]error{p.refuse: errors.New("nacked")}}
}

// TestPublisherRecordsWhatWasPublished: a partly failed batch records the
// messages that went out, and the error comes back unchanged.
func TestPublisherRecordsWhatWasPublished(t *testing.T) {
	c := &capture{}
	l := newLedger(t, c, ledger.Options{})
	msgs := []*sdk.Message{{ID: "a", Type: "t", IdempotencyKey: "ka"}, {ID: "b"}, {ID: "c"}}
	err := l.Publisher(partial{refuse: "b"}).Publish(context.Background(), "q", msgs...)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish = %v, want the PublishError", err)
	}
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := map[string]ledger.Event{}
	for _, e := range c.all() {
		got[e.MessageID] = e
	}
	if len(got) != 2 || got["b"].MessageID != "" {
		t.Fatalf("recorded %v, want a and c", got)
	}
	a := got["a"]
	if a.Status != ledger.StatusEnqueued || a.Queue != "q" || a.Type != "t" || a.IdempotencyKey != "ka" || a.CorrelationID != "a" {
		t.Errorf("event %+v", a)
	}
	// Validation failures publish nothing and record nothing.
	if err := l.Publisher(partial{}).Publish(context.Background(), "bad queue!", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Fatalf("Publish to a bad queue = %v", err)
	}
	_ = l.Flush(testCtx(t, 10*time.Second))
	if n := len(c.all()); n != 2 {
		t.Errorf("%d events after a refused publish, want 2", n)
	}
}

func TestFilterCheck(t *testing.T) {
	bad := []ledger.Filter{
		{Statuses: []ledger.Status{"exploded"}},
		{Limit: -1},
		{After: "%%%"},
		{Since: time.Now(), Until: time.Now().Add(-time.Hour)},
	}
	for _, f := range bad {
		if _, err := f.Check(); !errors.Is(err, ledger.ErrInvalidFilter) {
			t.Errorf("Check(%+v) = %v, want ErrInvalidFilter", f, err)
		}
	}
	f, err := ledger.Filter{Limit: 5000}.Check()
	if err != nil || f.Limit != ledger.MaxLimit {
		t.Errorf("Check(limit 5000) = %d, %v; want %d", f.Limit, err, ledger.MaxLimit)
	}
	ts, id, err := ledger.DecodeCursor(ledger.Cursor(time.UnixMicro(1234567), "x:y"))
	if err != nil || !ts.Equal(time.UnixMicro(1234567)) || id != "x:y" {
		t.Errorf("cursor round trip = %v %q %v", ts, id, err)
	}
}

// TestMetrics reads the ledger's instruments through an OpenTelemetry
// reader: events per result, batches, the buffer gauge and the lag.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	c := &capture{}
	// Linger -1: the writer writes its first event at once and blocks on
	// c.mu, so the buffer fills and the rest drop. With a linger it could
	// keep draining the buffer while the 20 Records run, and drop none.
	l := newLedger(t, c, ledger.Options{MeterProvider: mp, Buffer: 2, BlockTimeout: -1, Linger: -1})
	c.mu.Lock() // the writer blocks on its first batch: the buffer fills, the rest drop
	for range 20 {
		l.Record(ledger.Event{MessageID: "m", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	c.mu.Unlock()
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	s := l.Stats()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var lagCount uint64
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ledger.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					r, _ := p.Attributes.Value(ledger.AttrResult)
					got[m.Name+"/"+r.AsString()] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[m.Name] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					lagCount += p.Count
				}
			}
		}
	}
	want := map[string]int64{
		"berth.ledger.events/written": s.Written, "berth.ledger.events/dropped": s.Dropped,
		"berth.ledger.events/failed": 0, "berth.ledger.batches/": s.Batches, "berth.ledger.buffered": 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if s.Dropped == 0 || s.Written+s.Dropped != 20 || lagCount != uint64(s.Batches) {
		t.Errorf("stats %+v, %d lag points: want drops, 20 events in all, a lag per batch", s, lagCount)
	}
}

// counting is a Store whose Write blocks until released, and which counts
// the Writes in progress at once.
type counting struct {
	mu              sync.Mutex
	now, most, rows int
	release         chan struct{}
}

func (c *counting) Write(ctx context.Context, batch []ledger.Event) error {
	c.mu.Lock()
	c.now++
	c.most = max(c.most, c.now)
	c.mu.Unlock()
	<-c.release
	c.mu.Lock()
	c.now--
	c.rows += len(batch)
	c.mu.Unlock()
	return nil
}

// TestWritersWriteConcurrently: with Writers 3, three batches are written
// at once while the fourth waits, and Flush returns only when all of them
// are written.
func TestWritersWriteConcurrently(t *testing.T) {
	c := &counting{release: make(chan struct{})}
	l := newLedger(t, c, ledger.Options{Writers: 3, BatchSize: 1, Linger: -1})
	for i := range 10 {
		l.Record(ledger.Event{MessageID: string(rune('a' + i)), Status: ledger.StatusEnqueued, At: time.Now()})
	}
	flushed := make(chan error, 1)
	go func() { flushed <- l.Flush(testCtx(t, 10*time.Second)) }()
	for {
		c.mu.Lock()
		now := c.now
		c.mu.Unlock()
		if now == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-flushed:
		t.Fatalf("Flush returned (%v) while batches were being written", err)
	default:
	}
	close(c.release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.most != 3 || c.rows != 10 || c.now != 0 {
		t.Errorf("at most %d writes at once, %d rows written, %d in progress; want 3, 10, 0", c.most, c.rows, c.now)
	}
	if s := l.Stats(); s.Written != 10 || s.Batches != 10 {
		t.Errorf("stats %+v", s)
	}
}
