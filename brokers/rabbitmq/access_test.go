package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestReceiveAccessRefusedReported: a consumer the server refuses with 403
// ACCESS_REFUSED (the login may not use the queue) makes Receive return
// the server's error at once, as it does a 406, instead of retrying in the
// background while Receive waits until its ctx ends (and a Worker's Health
// says ready: the connection is up). Both where the refusal comes: the
// declaration of the topology, and, with NoDeclare on a queue declared by
// another login, basic.consume.
func TestReceiveAccessRefusedReported(t *testing.T) {
	node := integration.StartRabbitMQ(t)
	node.Ctl(t, "add_user", "berthnoread", "pw")
	// Every right but reading, except on the dead-letter exchange (a
	// binding to it reads it).
	node.Ctl(t, "set_permissions", "-p", "/", "berthnoread", ".*", ".*", "^berth\\.dlx$")
	url := strings.Replace(node.URL, "guest:guest", "berthnoread:pw", 1)
	fast := sdk.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}

	for _, c := range []struct {
		name      string
		noDeclare bool
	}{{"declare", false}, {"consume", true}} {
		t.Run(c.name, func(t *testing.T) {
			q := "berth_rmqtest_noread_" + c.name
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if c.noDeclare {
				admin := newBroker(t, node.URL, Options{Logger: quiet})
				if err := admin.DeclareQueue(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			b := newBroker(t, url, Options{Logger: quiet, NoDeclare: c.noDeclare, Reconnect: fast})
			_, err := b.Receive(ctx, q, 1)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused || ctx.Err() != nil {
				t.Fatalf("Receive on a queue the login may not read: %v, want the server's 403 (ACCESS_REFUSED) at once", err)
			}
			// The next Receive tries again (permissions may have been
			// fixed meanwhile) and reports the refusal again.
			if _, err := b.Receive(ctx, q, 1); !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
				t.Fatalf("second Receive: %v, want the 403 again", err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
