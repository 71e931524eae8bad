package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
)

// A message's ID is untrusted text (sdk.Prepare only asks for valid UTF-8):
// the error that dead-letters a message without an idempotency key became
// the dead-letter reason and a log line with the ID as it was, so a newline,
// a terminal escape or a bidirectional override in it forged or garbled
// them. The text now escapes it, as it quotes the job type; the error still
// carries the ID as it is.
func TestMissingKeyErrorEscapesMessageID(t *testing.T) {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		t.Error("handler ran for a message without a key")
		return nil
	}))
	const raw = "\n\r\x1b\u202e"
	for _, id := range []string{
		"m1\nlevel=ERROR msg=forged",
		"m1\x1b[2J",
		"m1\u202efdp.exe",
	} {
		m := &sdk.Message{ID: id, Type: "billing.charge", Body: []byte("{}")}
		err := h.Handle(context.Background(), berthtest.NewDelivery(m))
		var mk *idempotency.MissingKeyError
		switch {
		case !errors.Is(err, idempotency.ErrMissingKey) || !errors.As(err, &mk) || !sdk.IsPermanent(err):
			t.Fatalf("ID %q: %v, want a permanent MissingKeyError", id, err)
		case mk.MessageID != id:
			t.Errorf("MissingKeyError.MessageID = %q, want %q", mk.MessageID, id)
		case strings.ContainsAny(err.Error(), raw):
			t.Errorf("ID %q: error text %q has a raw control or bidi character", id, err.Error())
		}
	}
	// An ordinary ID reads as it is.
	if got := (&idempotency.MissingKeyError{MessageID: "0190a1b2-c3d4", Type: "t"}).Error(); !strings.Contains(got, "message 0190a1b2-c3d4 ") {
		t.Errorf("Error() = %q, want the ID unquoted", got)
	}
}
