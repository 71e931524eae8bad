package sdk

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// selfPanicking is a panic value whose String method panics with another
// selfPanicking: fmt recovers a String method's panic, but re-panics when
// printing that panic's value panics too.
type selfPanicking struct{}

func (selfPanicking) String() string { panic(selfPanicking{}) }

// nestedPanicky is an observer whose every hook panics with selfPanicking.
type nestedPanicky struct{}

func (nestedPanicky) Start(context.Context, Delivery) context.Context { panic(selfPanicking{}) }
func (nestedPanicky) Settled(context.Context, Delivery, Settlement)   { panic(selfPanicking{}) }
func (nestedPanicky) LeaseExtended(context.Context, Delivery, time.Duration, error) {
	panic(selfPanicking{})
}

// stubDelivery is a Delivery with a message and nothing else.
type stubDelivery struct {
	Delivery
	m *Message
}

func (d stubDelivery) Message() *Message { return d.m }

// panicLogs keeps the "panic" attribute of each record.
type panicLogs struct {
	mu     sync.Mutex
	panics []string
}

func (l *panicLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *panicLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *panicLogs) WithGroup(string) slog.Handler            { return l }
func (l *panicLogs) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "panic" {
			l.mu.Lock()
			l.panics = append(l.panics, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestObserverPanicValueWhosePrintingPanics: an observer panicking with a
// value that cannot be printed (its String method panics with a value whose
// String method panics: fmt.Sprint re-panics on such a nested panic) is
// still recovered and logged, by the value's type. Before, the panic of
// fmt.Sprint in the recovering defer escaped it and ended the process.
func TestObserverPanicValueWhosePrintingPanics(t *testing.T) {
	logs := &panicLogs{}
	w := &Worker{opts: WorkerOptions{Queue: "q", Logger: slog.New(logs)}}
	d := stubDelivery{m: &Message{ID: "id", Type: "t"}}
	ob := nestedPanicky{}
	ctx := context.WithValue(context.Background(), ctxKeyTest{}, "in")
	for _, hook := range []func(){
		func() {
			if got := w.observeStart(ctx, ob, d); got != ctx {
				t.Errorf("observeStart returned %v, want the context it was given", got)
			}
		},
		func() { w.observeSettled(ctx, ob, d, Settlement{}) },
		func() { w.observeLease(ctx, ob, d, time.Second, nil) },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("an observer panic escaped the Worker's recovery (%T)", r)
				}
			}()
			hook()
		}()
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.panics) != 3 {
		t.Fatalf("%d observer panics logged, want 3", len(logs.panics))
	}
	for _, p := range logs.panics {
		if !strings.Contains(p, "selfPanicking") {
			t.Errorf("panic logged as %q, want its type", p)
		}
	}
}

type ctxKeyTest struct{}
