package sdk_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// find returns the records whose message contains msg.
func (l *logRecords) find(msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, m := range l.recs {
		if strings.Contains(m["msg"], msg) {
			out = append(out, m)
		}
	}
	return out
}

func TestLogText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"order.created", "order.created"},
		{"bad\xffbyte", "bad\uFFFDbyte"},
		{strings.Repeat("a", sdk.MaxLogTextLength), strings.Repeat("a", sdk.MaxLogTextLength)},
		{strings.Repeat("a", sdk.MaxLogTextLength+1), strings.Repeat("a", sdk.MaxLogTextLength-len("…")) + "…"},
		// A cut never splits a rune: "é" is two bytes.
		{strings.Repeat("é", sdk.MaxLogTextLength), strings.Repeat("é", (sdk.MaxLogTextLength-len("…"))/2) + "…"},
	} {
		a := sdk.LogText("type", tc.in)
		if a.Key != "type" || a.Value.String() != tc.want {
			t.Errorf("LogText(%.20q…) = %s=%.30q (%d bytes), want %.30q (%d bytes)", tc.in, a.Key, a.Value.String(), len(a.Value.String()), tc.want, len(tc.want))
		}
	}
	if v := sdk.LogCause("cause", nil).Value.Resolve(); v.Any() != nil {
		t.Errorf("LogCause(nil) = %v, want nil", v)
	}
	long := errors.New("bad order \xff" + strings.Repeat("x", 3*sdk.MaxReasonLength))
	if s := sdk.LogCause("cause", long).Value.Resolve().String(); !strings.HasPrefix(s, "bad order \uFFFD") || len(s) > sdk.MaxReasonLength || !strings.HasSuffix(s, "…") {
		t.Errorf("LogCause of a long error = %.30q… (%d bytes), want its valid text cut to %d bytes", s, len(s), sdk.MaxReasonLength)
	}
}

// TestWorkerLogsBoundedMessageFields: a message whose ID, type and
// correlation ID are 64 KiB each (a producer outside berth may write them)
// and whose handler fails with an error quoting a 64 KiB body is logged with
// every field valid and bounded, in the settlement record and in a handler
// panic's, and it is still settled as the handler decided.
func TestWorkerLogsBoundedMessageFields(t *testing.T) {
	huge := "\xff" + strings.Repeat("z", 64<<10)
	for _, tc := range []struct {
		name, msg string
		h         sdk.HandlerFunc
		want      string
	}{
		{"error", "berth: settled", func(_ context.Context, d sdk.Delivery) error {
			return errors.New("cannot parse " + string(d.Message().Body))
		}, "retry"},
		{"panic", "berth: handler panic", func(_ context.Context, d sdk.Delivery) error {
			panic("cannot parse " + string(d.Message().Body))
		}, "retry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := newFakeSub()
			logs := &logRecords{all: true}
			stop := runWorker(t, sub, tc.h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(logs)})
			f := berthtest.NewDelivery(&sdk.Message{ID: "id" + huge, Type: "type" + huge, CorrelationID: "corr" + huge, Body: []byte(huge)},
				berthtest.Attempt(1), berthtest.Queue("q"))
			sub.ch <- f
			f.Wait(t)
			if err := stop(); err != nil {
				t.Fatalf("Run returned %v", err)
			}
			if a := actions(f); len(a) != 1 || a[0] != tc.want {
				t.Fatalf("settled %v, want [%s]", a, tc.want)
			}
			recs := logs.find(tc.msg)
			if len(recs) == 0 {
				t.Fatalf("no %q record logged", tc.msg)
			}
			for _, r := range recs {
				for key, limit := range map[string]int{"id": sdk.MaxLogTextLength, "type": sdk.MaxLogTextLength, "correlation_id": sdk.MaxLogTextLength, "cause": sdk.MaxReasonLength, "panic": sdk.MaxReasonLength} {
					v, ok := r[key]
					if !ok {
						continue
					}
					if len(v) > limit || !utf8.ValidString(v) {
						t.Errorf("%s: %s logged as %d bytes (valid UTF-8 %v), want valid and at most %d", tc.msg, key, len(v), utf8.ValidString(v), limit)
					}
				}
				if tc.name == "error" && !strings.HasPrefix(r["cause"], "cannot parse") {
					t.Errorf("cause logged as %.40q, want the handler's error", r["cause"])
				}
				if _, ok := r["type"]; !ok {
					t.Errorf("%s: no type logged: %v", tc.msg, r)
				}
			}
		})
	}
}
