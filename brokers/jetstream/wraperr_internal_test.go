package jetstream

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/sdk"
)

// TestWrapErrConnectionFailures: an error of the connection itself, as
// nats.go returns it when a write fails before it has noticed the
// connection is gone, says to publish again (sdk.ErrUnavailable), keeps
// the cause, and other errors are not taken for it. (A conformance run saw
// PublishAsync return "write: connection reset by peer" unclassified.)
func TestWrapErrConnectionFailures(t *testing.T) {
	b := &Broker{}
	ctx := context.Background()
	reset := &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	for _, err := range []error{reset, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, nats.ErrConnectionClosed, nats.ErrReconnectBufExceeded} {
		got := b.wrapErr(ctx, "publish", err)
		if !errors.Is(got, sdk.ErrUnavailable) || !errors.Is(got, err) {
			t.Errorf("wrapErr(%v) = %v, want it to wrap ErrUnavailable and the cause", err, got)
		}
	}
	for _, err := range []error{nats.ErrMaxPayload, nats.ErrBadSubject, errors.New("stream not found")} {
		if got := b.wrapErr(ctx, "publish", err); errors.Is(got, sdk.ErrUnavailable) {
			t.Errorf("wrapErr(%v) = %v: not a connection failure, must not say ErrUnavailable", err, got)
		}
	}
}
