package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

type chargeOrder struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

func (chargeOrder) Kind() string { return "billing.charge" }

func (c chargeOrder) IdempotencyKey() string { return "charge:" + c.OrderID + ":v1" }

type sendReceipt struct {
	OrderID string `json:"order_id"`
}

func (*sendReceipt) Kind() string { return "email.receipt" } // a pointer receiver works on the nil zero value

type noKind struct{}

func (noKind) Kind() string { return "" }

func TestNewJobTakesTypeAndKeyFromArgs(t *testing.T) {
	m, err := sdk.NewJob(chargeOrder{OrderID: "o1", Cents: 4200})
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != "billing.charge" || m.IdempotencyKey != "charge:o1:v1" || string(m.Body) != `{"order_id":"o1","cents":4200}` {
		t.Fatalf("message %q key %q body %s", m.Type, m.IdempotencyKey, m.Body)
	}
	m, err = sdk.NewJob(&sendReceipt{OrderID: "o1"})
	if err != nil || m.Type != "email.receipt" || m.IdempotencyKey != "" {
		t.Fatalf("pointer args: %+v, %v", m, err)
	}
	if _, err := sdk.NewJob(noKind{}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Fatalf("empty kind: %v, want ErrInvalidMessage", err)
	}
	if _, err := sdk.NewJob(nil); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Fatalf("nil args: %v, want ErrInvalidMessage", err)
	}
}

// TestNewJobRefusesNilPointerArgs: a nil pointer to args whose Kind has a
// value receiver (the common way to declare it, as chargeOrder does) is
// refused with ErrInvalidMessage like any args that encode to null; NewJob
// panicked calling Kind on it ("value method called using nil pointer").
func TestNewJobRefusesNilPointerArgs(t *testing.T) {
	var m *sdk.Message
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("NewJob((*chargeOrder)(nil)) panicked: %v", r)
			}
		}()
		m, err = sdk.NewJob((*chargeOrder)(nil))
	}()
	if m != nil || !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Fatalf("NewJob((*chargeOrder)(nil)) = %+v, %v; want ErrInvalidMessage", m, err)
	}
}

// TestHandleJobRoutesDecodedArgs: a typed handler is registered under its
// args' kind, receives them decoded with the delivery, and its errors are
// settled as any handler's.
func TestHandleJobRoutesDecodedArgs(t *testing.T) {
	r := sdk.NewRouter()
	var got chargeOrder
	var attempt int
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[chargeOrder]) error {
		got, attempt = j.Args, j.Delivery.Attempt()
		if j.Args.Cents <= 0 {
			return sdk.Permanent(fmt.Errorf("order %s: nothing to charge", j.Args.OrderID))
		}
		return nil
	})
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[*sendReceipt]) error { return errors.New("smtp down") })
	if ts := r.Types(); strings.Join(ts, ",") != "billing.charge,email.receipt" {
		t.Fatalf("types %v", ts)
	}

	m, _ := sdk.NewJob(chargeOrder{OrderID: "o7", Cents: 100})
	if res := berthtest.Work(t, r, m, berthtest.Attempt(2)); !res.Acked() || got.OrderID != "o7" || got.Cents != 100 || attempt != 2 {
		t.Fatalf("charge: %s (%v), args %+v at attempt %d", res.Action, res.Cause, got, attempt)
	}
	m, _ = sdk.NewJob(chargeOrder{OrderID: "o8"})
	if res := berthtest.Work(t, r, m); !res.DeadLettered() || !strings.Contains(res.Reason, "nothing to charge") {
		t.Fatalf("zero charge: %s %q, want a dead letter", res.Action, res.Reason)
	}
	m, _ = sdk.NewJob(&sendReceipt{OrderID: "o7"})
	if res := berthtest.Work(t, r, m); res.Action != sdk.ActionRetry || res.Class != sdk.ClassTransient {
		t.Fatalf("receipt: %s %s, want a transient retry", res.Action, res.Class)
	}
	bad := &sdk.Message{Type: "billing.charge", Body: []byte(`{"order_id": 7}`)}
	if res := berthtest.Work(t, r, bad); !res.DeadLettered() || !errors.Is(res.Cause, sdk.ErrUndecodable) {
		t.Fatalf("undecodable: %s (%v), want a dead letter wrapping ErrUndecodable", res.Action, res.Cause)
	}
}

// TestJobHandlerRefusesOtherKinds: a typed handler mounted for another type
// (a wiring mistake) dead-letters instead of decoding a foreign body.
func TestJobHandlerRefusesOtherKinds(t *testing.T) {
	called := false
	h := sdk.JobHandler(func(context.Context, sdk.Job[chargeOrder]) error { called = true; return nil })
	res := berthtest.Work(t, h, &sdk.Message{Type: "email.receipt", Body: []byte(`{}`)})
	if !res.DeadLettered() || !errors.Is(res.Cause, sdk.ErrUnknownJobType) || called {
		t.Fatalf("foreign type: %s (%v), handler called %v", res.Action, res.Cause, called)
	}
}

func TestHandleJobPanicsOnWiringBugs(t *testing.T) {
	mustPanic := func(name, want string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(fmt.Sprint(r), want) {
				t.Errorf("%s: panic %v, want one mentioning %q", name, r, want)
			}
		}()
		f()
	}
	ok := func(context.Context, sdk.Job[chargeOrder]) error { return nil }
	r := sdk.NewRouter()
	sdk.HandleJob(r, ok)
	mustPanic("twice", "registered twice", func() { sdk.HandleJob(r, ok) })
	mustPanic("typed then untyped", "registered twice", func() {
		r.RegisterFunc("billing.charge", func(context.Context, sdk.Delivery) error { return nil })
	})
	mustPanic("empty kind", "empty Kind", func() {
		sdk.HandleJob(sdk.NewRouter(), func(context.Context, sdk.Job[noKind]) error { return nil })
	})
	mustPanic("nil func", "nil function", func() { sdk.HandleJob[chargeOrder](sdk.NewRouter(), nil) })
}
