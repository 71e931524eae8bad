package telemetry_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// partialFail publishes a batch of three and fails the first message as
// unavailable and the second as too large, as a broker's partial failure
// ([sdk.PublishError]) reports each message's own error.
type partialFail struct{}

func (partialFail) Publish(_ context.Context, _ string, msgs ...*sdk.Message) error {
	return &sdk.PublishError{Failed: map[string]error{
		msgs[0].ID: sdk.ErrUnavailable,
		msgs[1].ID: sdk.ErrMessageTooLarge,
	}}
}

// TestPartialBatchFailureCountsEachMessagesErrorType: the failed messages of
// a partly published batch are counted under their own error.type (as their
// create spans record it), not all under the one that errors.Is happens to
// find first in the PublishError, which depends on map order.
func TestPartialBatchFailureCountsEachMessagesErrorType(t *testing.T) {
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{System: "fake"})
	err := obs.Publisher(partialFail{}).Publish(context.Background(), "pf", &sdk.Message{}, &sdk.Message{}, &sdk.Message{})
	var perr *sdk.PublishError
	if !errors.As(err, &perr) {
		t.Fatalf("publish: %v, want a PublishError", err)
	}
	ms := collect(t, reader)
	for _, c := range []struct {
		errType string
		want    float64
	}{{"unavailable", 1}, {"message_too_large", 1}} {
		if got := ms.sum("messaging.client.sent.messages", semconvDest("pf"), telemetryErrorType(c.errType)); got != c.want {
			t.Errorf("failed sends with error.type %s: %v, want %v", c.errType, got, c.want)
		}
	}
	if got := ms.sum("messaging.client.sent.messages", semconvDest("pf")); got != 3 {
		t.Errorf("sends counted %v, want 3 (1 sent, 2 failed)", got)
	}
}
