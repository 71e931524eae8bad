package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
	"github.com/google/uuid"
)

func TestBackoff(t *testing.T) {
	b := sdk.Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for _, tc := range []struct {
		attempt int
		u       float64
		want    time.Duration
	}{
		{1, 0, 100 * time.Millisecond},
		{2, 0, 200 * time.Millisecond},
		{4, 0, 800 * time.Millisecond},
		{5, 0, time.Second}, // capped
		{500, 0, time.Second},
		{1, 0.5, 125 * time.Millisecond},
		{0, 0, 100 * time.Millisecond}, // attempts below 1 count as 1
	} {
		if got := b.Delay(tc.attempt, tc.u); got != tc.want {
			t.Errorf("Delay(%d, %v) = %v, want %v", tc.attempt, tc.u, got, tc.want)
		}
	}
	if got := b.Delay(5, 0.9999); got >= 1500*time.Millisecond || got < time.Second {
		t.Errorf("jitter outside [delay, delay·1.5): %v", got)
	}
	if got := (sdk.Backoff{}).Delay(1, 0); got != sdk.DefaultBackoff.Base {
		t.Errorf("zero Backoff uses defaults: got %v", got)
	}
	if got := (sdk.Backoff{Base: time.Second, Jitter: -1}).Delay(1, 0.99); got != time.Second {
		t.Errorf("negative jitter means none: got %v", got)
	}
}

// TestBackoffHugeNeverNegative: a Max of math.MaxInt64 ("no cap") or a huge
// Jitter saturates instead of wrapping to a negative delay, which every
// broker clamps to 0: the retry would come at once instead of after the
// longest delay.
func TestBackoffHugeNeverNegative(t *testing.T) {
	for _, b := range []sdk.Backoff{
		{Base: time.Second, Max: math.MaxInt64},
		{Base: time.Hour, Max: math.MaxInt64, Jitter: 1},
		{Base: time.Second, Max: time.Hour, Jitter: 1e20},
		{Base: time.Second, Max: time.Hour, Jitter: math.Inf(1)},
	} {
		for _, attempt := range []int{1, 34, 40, 100, math.MaxInt} {
			floor := b.Delay(attempt, 0)
			if got := b.Delay(attempt, 0.999); got < floor || got <= 0 {
				t.Errorf("%+v.Delay(%d, 0.999) = %v, want at least the unjittered %v", b, attempt, got, floor)
			}
		}
	}
	if got := (sdk.Backoff{Base: time.Second, Jitter: math.NaN()}).Delay(1, 0.5); got != time.Second {
		t.Errorf("NaN jitter: got %v, want none (1s)", got)
	}
}

func TestPrepare(t *testing.T) {
	ctx := sdk.WithCorrelationID(context.Background(), "flow-1")
	m := &sdk.Message{Type: "t", Body: []byte("x")}
	if err := sdk.Prepare(ctx, "jobs", m, 0); err != nil {
		t.Fatal(err)
	}
	id, err := uuid.Parse(m.ID)
	if err != nil || id.Version() != 7 {
		t.Errorf("ID %q is not a UUIDv7 (%v)", m.ID, err)
	}
	if m.CorrelationID != "flow-1" {
		t.Errorf("CorrelationID %q, want the context's", m.CorrelationID)
	}
	kept := &sdk.Message{ID: "mine", CorrelationID: "c"}
	if err := sdk.Prepare(context.Background(), "jobs", kept, 0); err != nil || kept.ID != "mine" || kept.CorrelationID != "c" {
		t.Errorf("Prepare overwrote given fields: %+v %v", kept, err)
	}
	gen := &sdk.Message{}
	if err := sdk.Prepare(context.Background(), "jobs", gen, 0); err != nil || gen.CorrelationID != gen.ID {
		t.Errorf("outside a flow the message starts one under its own ID: %+v %v", gen, err)
	}

	var tooLarge *sdk.MessageTooLargeError
	if err := sdk.Prepare(ctx, "jobs", &sdk.Message{Body: make([]byte, 100)}, 64); !errors.As(err, &tooLarge) || !errors.Is(err, sdk.ErrMessageTooLarge) || tooLarge.Limit != 64 {
		t.Errorf("oversized: %v", err)
	}
	for _, q := range []string{"", "has space", ".dot", strings.Repeat("q", 81), "semi;colon"} {
		if err := sdk.Prepare(ctx, q, &sdk.Message{}, 0); !errors.Is(err, sdk.ErrInvalidQueue) {
			t.Errorf("queue %q: %v, want ErrInvalidQueue", q, err)
		}
	}
	bad := &sdk.Message{Headers: map[string]string{"k": string([]byte{0xff})}}
	if err := sdk.Prepare(ctx, "jobs", bad, 0); !errors.Is(err, sdk.ErrInvalidHeader) {
		t.Errorf("non-UTF-8 header: %v", err)
	}
	if err := sdk.Prepare(ctx, "jobs", &sdk.Message{Delay: -time.Second}, 0); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("negative delay: %v", err)
	}
	if err := sdk.Prepare(ctx, "jobs", nil, 0); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("nil message: %v", err)
	}
}

func TestClassify(t *testing.T) {
	base := errors.New("x")
	for err, want := range map[error]sdk.ErrorClass{
		nil:                                      sdk.ClassNone,
		base:                                     sdk.ClassTransient,
		sdk.Permanent(base):                      sdk.ClassPermanent,
		fmt.Errorf("w: %w", sdk.Permanent(base)): sdk.ClassPermanent,
		sdk.RetryAfter(base, time.Second):        sdk.ClassRetryAfter,
		&sdk.PanicError{Value: 1}:                sdk.ClassPanic,
		&sdk.PanicError{Value: sdk.Permanent(base)}:                      sdk.ClassPanic,
		&sdk.PanicError{Value: sdk.RetryAfter(base, time.Second)}:        sdk.ClassPanic,
		fmt.Errorf("w: %w", &sdk.PanicError{Value: sdk.Permanent(base)}): sdk.ClassPanic,
		sdk.Permanent(&sdk.PanicError{Value: sdk.Permanent(base)}):       sdk.ClassPermanent, // marked outside the panic
		sdk.RetryAfter(&sdk.PanicError{Value: 1}, time.Second):           sdk.ClassRetryAfter,
		fmt.Errorf("w: %w", sdk.ErrMaxDeliveries):                        sdk.ClassPoison,
		context.Canceled: sdk.ClassCanceled,
	} {
		if got := sdk.Classify(err); got != want {
			t.Errorf("Classify(%v) = %q, want %q", err, got, want)
		}
	}
	if sdk.Permanent(nil) != nil {
		t.Error("Permanent(nil) must be nil")
	}
	if !errors.Is(sdk.Permanent(base), base) || !errors.Is(sdk.RetryAfter(base, 0), base) {
		t.Error("wrapped errors lost their cause")
	}
}

func TestRouter(t *testing.T) {
	r := sdk.NewRouter()
	r.RegisterFunc("a", func(context.Context, sdk.Delivery) error { return errors.New("from a") })
	if err := r.Handle(context.Background(), newFake(1, "a")); err == nil || err.Error() != "from a" {
		t.Errorf("route a: %v", err)
	}
	err := r.Handle(context.Background(), newFake(1, "nope"))
	if !errors.Is(err, sdk.ErrUnknownJobType) || !sdk.IsPermanent(err) {
		t.Errorf("unknown type: %v, want a permanent ErrUnknownJobType", err)
	}
	if got := r.Types(); len(got) != 1 || got[0] != "a" {
		t.Errorf("Types() = %v", got)
	}
}

func TestDecode(t *testing.T) {
	type charge struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	v, err := sdk.Decode[charge](&sdk.Message{Body: []byte(`{"order":"o1","amount":5}`)})
	if err != nil || v.Order != "o1" || v.Amount != 5 {
		t.Fatalf("Decode = %+v, %v", v, err)
	}
	added, err := sdk.Decode[charge](&sdk.Message{Body: []byte(`{"order":"o2","amount":7,"currency":"EUR"}`)})
	if err != nil || added.Order != "o2" {
		t.Errorf("a field added by a newer producer must not dead-letter the job: %+v %v", added, err)
	}
	if _, err := sdk.DecodeStrict[charge](&sdk.Message{Body: []byte(`{"order":"o2","currency":"EUR"}`)}); !errors.Is(err, sdk.ErrUndecodable) || !sdk.IsPermanent(err) {
		t.Errorf("DecodeStrict accepted an unknown field: %v", err)
	}
	for _, body := range []string{`{"order":`, `{"amount":"five"}`, `{} {}`, ``, `[1]`} {
		_, err := sdk.Decode[charge](&sdk.Message{ID: "m", Type: "charge", Body: []byte(body)})
		var de *sdk.DecodeError
		if !sdk.IsPermanent(err) || !errors.Is(err, sdk.ErrUndecodable) || !errors.As(err, &de) || de.MessageID != "m" {
			t.Errorf("Decode(%q) = %v, want a permanent DecodeError", body, err)
		}
	}
	called := false
	h := sdk.JSON(func(ctx context.Context, d sdk.Delivery, v charge) error { called = true; return nil })
	if err := h.Handle(context.Background(), newFake(1, "charge")); !sdk.IsPermanent(err) || called {
		t.Errorf("JSON handler on an empty body: %v (called %v)", err, called)
	}
}

func TestChainOrder(t *testing.T) {
	var trace []string
	mw := func(name string) sdk.Middleware {
		return func(next sdk.Handler) sdk.Handler {
			return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				trace = append(trace, name)
				return next.Handle(ctx, d)
			})
		}
	}
	h := sdk.Chain(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { trace = append(trace, "h"); return nil }), mw("a"), mw("b"))
	_ = h.Handle(context.Background(), newFake(1, "x"))
	if strings.Join(trace, ",") != "a,b,h" {
		t.Fatalf("order %v, want a,b,h", trace)
	}
}

func TestAnnotateAndRedrive(t *testing.T) {
	m := &sdk.Message{ID: "m1"}
	first := time.Date(2026, 8, 14, 10, 0, 0, 0, time.UTC)
	now := first.Add(time.Minute)
	sdk.AnnotateDeadLetter(m, "billing", 3, sdk.Permanent(errors.New("order missing")), first, now)
	for h, want := range map[string]string{
		sdk.HeaderDeadLetterReason:   "permanent: order missing",
		sdk.HeaderDeadLetterClass:    "permanent",
		sdk.HeaderDeadLetterAttempts: "3",
		sdk.HeaderDeadLetterQueue:    "billing",
		sdk.HeaderFirstFailure:       "2026-08-14T10:00:00Z",
		sdk.HeaderLastFailure:        "2026-08-14T10:01:00Z",
	} {
		if got := m.Header(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	q := sdk.PrepareRedrive(m, "billing")
	if q != "billing" || m.Header(sdk.HeaderRedriveCount) != "1" || m.Header(sdk.HeaderDeadLetterReason) != "" {
		t.Errorf("redrive: queue %q headers %v", q, m.Headers)
	}
	sdk.AnnotateDeadLetter(m, "billing", 1, errors.New("again"), time.Time{}, now)
	sdk.PrepareRedrive(m, "billing")
	if m.Header(sdk.HeaderRedriveCount) != "2" {
		t.Errorf("second redrive count %q", m.Header(sdk.HeaderRedriveCount))
	}
}

func TestDeadLetterReasonFitsEveryBroker(t *testing.T) {
	m := &sdk.Message{}
	sdk.AnnotateDeadLetter(m, "q", 1, errors.New("bad \xff byte "+strings.Repeat("é", 4000)), time.Time{}, time.Now())
	r := m.Header(sdk.HeaderDeadLetterReason)
	if !utf8.ValidString(r) || len(r) > sdk.MaxReasonLength || !strings.HasPrefix(r, "bad \uFFFD byte é") {
		t.Errorf("reason %d bytes, valid UTF-8 %v: %.40q", len(r), utf8.ValidString(r), r)
	}
	sdk.AnnotateDeadLetter(m, "q", 1, nil, time.Time{}, time.Now())
	if m.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassUnknown) {
		t.Errorf("class of a dead letter without a cause: %q", m.Header(sdk.HeaderDeadLetterClass))
	}
}

func TestPanicErrorUnwraps(t *testing.T) {
	cause := errors.New("nil map")
	if !errors.Is(&sdk.PanicError{Value: cause}, cause) {
		t.Error("a panic with an error value does not unwrap to it")
	}
	if (&sdk.PanicError{Value: "text"}).Unwrap() != nil {
		t.Error("a panic with a non-error value unwraps to something")
	}
}

func TestPublishError(t *testing.T) {
	cause := errors.New("throttled")
	err := error(&sdk.PublishError{Failed: map[string]error{"m1": cause}})
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "m1") {
		t.Fatalf("PublishError %v does not name the message or wrap the cause", err)
	}
	two := &sdk.PublishError{Failed: map[string]error{"b": cause, "a": cause}}
	for range 10 {
		if !strings.Contains(two.Error(), "2 messages, e.g. a:") {
			t.Fatalf("PublishError text is not deterministic: %v", two)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	m := &sdk.Message{Headers: map[string]string{"a": "1"}, Body: []byte("b")}
	c := m.Clone()
	c.Headers["a"] = "2"
	c.Body[0] = 'x'
	if m.Headers["a"] != "1" || m.Body[0] != 'b' {
		t.Fatal("Clone shares memory with the original")
	}
}

// Issue 11 item 2: names starting with "berth-" (any case) are reserved for
// brokers; Prepare refuses them from applications with a typed error.
func TestHardening2_PrepareRefusesReservedHeaders(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{sdk.HeaderDeadLetterQueue, sdk.HeaderRedriveCount, "BERTH-dlq-queue", "Berth-anything", "berth-"} {
		m := &sdk.Message{Headers: map[string]string{"ok": "1", name: "evil"}}
		err := sdk.Prepare(ctx, "jobs", m, 0)
		var he *sdk.HeaderError
		if !errors.Is(err, sdk.ErrInvalidMessage) || !errors.As(err, &he) || he.Name != name {
			t.Errorf("header %q: %v, want ErrInvalidMessage with a HeaderError naming it", name, err)
		}
		if err := sdk.PrepareAll(ctx, "jobs", []*sdk.Message{{}, m}, 0); !errors.Is(err, sdk.ErrInvalidMessage) {
			t.Errorf("PrepareAll with header %q: %v, want ErrInvalidMessage", name, err)
		}
	}
	for _, name := range []string{"berth", "berthx-a", "x-berth-a", "traceparent"} {
		if err := sdk.Prepare(ctx, "jobs", &sdk.Message{Headers: map[string]string{name: "v"}}, 0); err != nil {
			t.Errorf("header %q is not reserved: %v", name, err)
		}
	}
	if !sdk.IsReservedHeader("BeRtH-x") || sdk.IsReservedHeader("berth") {
		t.Error("IsReservedHeader is wrong")
	}
}

// Issue 11 item 2: the redrive target is the queue whose dead letters are
// redriven, never the (forgeable) HeaderDeadLetterQueue value.
func TestHardening2_PrepareRedriveIgnoresForgedQueue(t *testing.T) {
	m := &sdk.Message{Headers: map[string]string{sdk.HeaderDeadLetterQueue: "evil", sdk.HeaderRedriveCount: "2", "app": "kept"}}
	if got := sdk.PrepareRedrive(m, "orders"); got != "orders" {
		t.Errorf("PrepareRedrive target = %q, want the queue redriven (orders)", got)
	}
	if m.Header(sdk.HeaderDeadLetterQueue) != "" || m.Header(sdk.HeaderRedriveCount) != "3" || m.Header("app") != "kept" {
		t.Errorf("headers after PrepareRedrive: %v", m.Headers)
	}
}

// Issue 11 item 5: the string fields brokers carry as text must be UTF-8;
// the error names the field. The body may be any bytes.
func TestHardening5_PrepareRefusesNonUTF8Fields(t *testing.T) {
	ctx := context.Background()
	bad := "order:\xfe"
	for field, m := range map[string]*sdk.Message{
		"ID":             {ID: bad},
		"Type":           {Type: bad},
		"Key":            {Key: bad},
		"IdempotencyKey": {IdempotencyKey: bad},
		"CorrelationID":  {CorrelationID: bad},
	} {
		err := sdk.Prepare(ctx, "jobs", m, 0)
		if !errors.Is(err, sdk.ErrInvalidMessage) || !strings.Contains(err.Error(), field+" ") {
			t.Errorf("%s not UTF-8: %v, want ErrInvalidMessage naming %s", field, err, field)
		}
		if err != nil && !utf8.ValidString(err.Error()) {
			t.Errorf("%s: error text is not UTF-8: %q", field, err.Error())
		}
	}
	if err := sdk.Prepare(ctx, "jobs", &sdk.Message{Key: "order:é", Body: []byte{0xff, 0xfe, 0}}, 0); err != nil {
		t.Errorf("UTF-8 key and binary body: %v", err)
	}
}

// TestBackoffMaxBelowBase: Max caps the delay, as the formula
// min(Max, Base·2^(attempt-1)) says, also when it is below Base — the
// usual way to get there being a RetryByType entry that sets only Max and
// inherits the Worker's Base (1s by default). Max was raised to Base
// instead: an entry asking for retries within 100ms got 1s.
func TestBackoffMaxBelowBase(t *testing.T) {
	for _, tc := range []struct {
		b    sdk.Backoff
		want time.Duration
	}{
		{sdk.Backoff{Max: 100 * time.Millisecond, Jitter: -1}, 100 * time.Millisecond}, // Base: the default 1s
		{sdk.Backoff{Base: 10 * time.Second, Max: time.Second, Jitter: -1}, time.Second},
	} {
		for _, attempt := range []int{1, 2, 10, math.MaxInt} {
			if got := tc.b.Delay(attempt, 0.5); got != tc.want {
				t.Errorf("%+v.Delay(%d) = %v, want Max %v", tc.b, attempt, got, tc.want)
			}
		}
	}
}
