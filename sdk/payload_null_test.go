package sdk_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// TestDecodeRefusesNull: a body that is the JSON literal null carries no
// payload: decoding it into a struct gave the zero value and into a pointer
// a nil pointer, both with no error, so a handler processed an empty job or
// dereferenced nil. It is an undecodable body: a permanent DecodeError,
// dead-lettered at once.
func TestDecodeRefusesNull(t *testing.T) {
	for _, body := range []string{`null`, " null\n"} {
		m := &sdk.Message{ID: "m", Type: "t", Body: []byte(body)}
		check := func(what string, err error) {
			t.Helper()
			var de *sdk.DecodeError
			if !sdk.IsPermanent(err) || !errors.Is(err, sdk.ErrUndecodable) || !errors.As(err, &de) || de.MessageID != "m" {
				t.Errorf("%s(%q) = %v, want a permanent DecodeError", what, body, err)
			}
		}
		v, err := sdk.Decode[*sendReceipt](m)
		check("Decode[*sendReceipt]", err)
		if err == nil && v == nil {
			t.Errorf("Decode[*sendReceipt](%q) returned a nil pointer and no error", body)
		}
		_, err = sdk.DecodeStrict[*sendReceipt](m)
		check("DecodeStrict[*sendReceipt]", err)
		_, err = sdk.Decode[chargeOrder](m)
		check("Decode[chargeOrder]", err)
		_, err = sdk.DecodeStrict[chargeOrder](m)
		check("DecodeStrict[chargeOrder]", err)
	}
	// A field set to null is still the field's zero value, as before.
	if v, err := sdk.Decode[*sendReceipt](&sdk.Message{Body: []byte(`{"order_id":null}`)}); err != nil || v == nil {
		t.Errorf("a null field: %v, %v", v, err)
	}
}

// TestTypedJobWithNullBodyIsDeadLettered: through a Worker, a typed job with
// pointer args and a null body is dead- lettered on its first attempt
// without calling the handler (it panicked on the nil args and was retried
// as a transient failure until its attempts ran out), and NewJob refuses
// typed-nil args rather than publish a null body.
func TestTypedJobWithNullBodyIsDeadLettered(t *testing.T) {
	r := sdk.NewRouter()
	called := false
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[*sendReceipt]) error {
		called = true
		_ = j.Args.OrderID
		return nil
	})
	res := berthtest.Work(t, r, &sdk.Message{Type: "email.receipt", Body: []byte(`null`)})
	if !res.DeadLettered() || called || !errors.Is(res.Cause, sdk.ErrUndecodable) {
		t.Errorf("null body: %s (cause %v), handler called %v; want dead-lettered as undecodable, not called", res.Action, res.Cause, called)
	}
	if m, err := sdk.NewJob((*sendReceipt)(nil)); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("NewJob(typed nil) = %+v, %v; want ErrInvalidMessage", m, err)
	}
}
