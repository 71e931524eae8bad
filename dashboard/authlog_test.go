package dashboard

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// captured is a slog.Handler that keeps the records it is given.
type captured struct {
	mu  sync.Mutex
	all []slog.Record
}

func (h *captured) Enabled(context.Context, slog.Level) bool { return true }
func (h *captured) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, r.Clone())
	return nil
}
func (h *captured) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captured) WithGroup(string) slog.Handler      { return h }

func (h *captured) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.all...)
}

func attrOf(r slog.Record, key string) (v slog.Value, ok bool) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, ok = a.Value, true
			return false
		}
		return true
	})
	return v, ok
}

// A flood of wrong tokens cannot fill the log: the first refusal is logged
// at once, the others within the second are counted and logged as one line
// (their count and the latest of them) when the second ends, and a refusal
// after a quiet second is logged at once again. The clock and the timer are
// the test's: no waiting.
func TestRefusalLogBounded(t *testing.T) {
	h := &captured{}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	type timer struct {
		d time.Duration
		f func()
	}
	var timers []timer
	l := newAuthLog(slog.New(h))
	l.now = func() time.Time { return now }
	l.after = func(d time.Duration, f func()) { timers = append(timers, timer{d, f}) }
	h2 := requireToken("the-right-token-0123", l, nil)
	refuse := func(i int) {
		r := httptest.NewRequest("GET", "/queues/q"+strconv.Itoa(i), nil)
		r.RemoteAddr = "192.0.2.7:" + strconv.Itoa(40000+i)
		r.Header.Set("Authorization", "Bearer guess-"+strconv.Itoa(i))
		w := httptest.NewRecorder()
		h2.ServeHTTP(w, r)
		if w.Code != 401 {
			t.Fatalf("refusal %d: %d", i, w.Code)
		}
	}

	refuse(0)
	for i := 1; i <= 1000; i++ {
		now = now.Add(100 * time.Microsecond) // 1,000 in 0.1 s
		refuse(i)
	}
	if got := len(h.records()); got != 1 {
		t.Fatalf("1,001 refusals within a second: %d lines, want 1", got)
	}
	// Armed by the second refusal, 100µs into the second, for its end.
	if len(timers) != 1 || timers[0].d != time.Second-100*time.Microsecond {
		t.Fatalf("timers %v, want one, at the end of the second (999.9ms)", timers)
	}
	now = now.Add(900 * time.Millisecond)
	timers[0].f()
	rs := h.records()
	if len(rs) != 2 {
		t.Fatalf("after the second: %d lines, want 2", len(rs))
	}
	if c, _ := attrOf(rs[1], "count"); c.Int64() != 1000 || rs[1].Level != slog.LevelWarn {
		t.Errorf("the summary: %s count %v, want 1000", rs[1].Level, c)
	}
	latest, _ := attrOf(rs[1], "latest")
	want := map[string]string{"remote": "192.0.2.7:41000", "path": "/queues/q1000", "method": "GET"}
	for _, a := range latest.Group() {
		if want[a.Key] != a.Value.String() {
			t.Errorf("latest %s=%q, want %q", a.Key, a.Value, want[a.Key])
		}
		delete(want, a.Key)
	}
	if len(want) != 0 {
		t.Errorf("latest lacks %v", want)
	}

	// Right after the summary: counted again, not logged at once.
	now = now.Add(10 * time.Millisecond)
	refuse(2000)
	if len(h.records()) != 2 || len(timers) != 2 {
		t.Fatalf("a refusal right after the summary: %d lines, %d timers", len(h.records()), len(timers))
	}
	now = now.Add(990 * time.Millisecond)
	timers[1].f()
	if rs := h.records(); len(rs) != 3 {
		t.Fatalf("%d lines, want 3", len(rs))
	} else if c, _ := attrOf(rs[2], "count"); c.Int64() != 1 {
		t.Errorf("the second summary counts %v, want 1", c)
	}

	// After a quiet second: logged at once, with no timer.
	now = now.Add(5 * time.Second)
	refuse(3000)
	rs = h.records()
	if len(rs) != 4 || len(timers) != 2 {
		t.Fatalf("after a quiet second: %d lines, %d timers", len(rs), len(timers))
	}
	if p, _ := attrOf(rs[3], "path"); p.String() != "/queues/q3000" {
		t.Errorf("path %q", p)
	}
	// A timer with nothing counted writes nothing.
	l.flush()
	if len(h.records()) != 4 {
		t.Errorf("an empty flush wrote a line")
	}
}
