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
	// Every right but reading, except on the dead-letter exchange (a
	// binding to it reads it).
	url := node.User(t, "berthnoread", ".*", ".*", "^berth\\.dlx$")
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

// refusedPublish reports whether err is the server's 403 (ACCESS_REFUSED)
// refusing a publish, and not a broker that is unavailable or closed.
func refusedPublish(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused &&
		!errors.Is(err, sdk.ErrUnavailable) && !errors.Is(err, sdk.ErrClosed)
}

// TestPublishAccessRefusedReported: a publish the server refuses with 403
// ACCESS_REFUSED (the login may not write to the default exchange) fails
// with the server's error, not one wrapping sdk.ErrUnavailable: a caller
// (the outbox relay, an AsyncPool) told "unavailable" retries as if the
// broker were down, for ever, and never parks the message. Publish and
// PublishAsync both; nothing reaches the queue; the refusal is not
// sticky: once the login may write, the next publish goes through. With
// NoDeclare (the queue declared by another login) and without (the login
// declares it, then may not publish to it).
func TestPublishAccessRefusedReported(t *testing.T) {
	node := integration.StartRabbitMQ(t)
	user := "berthnowrite_" + sdk.NewID()
	node.Ctl(t, "add_user", user, "pw")
	t.Cleanup(func() { node.Ctl(t, "delete_user", user) })
	// Every right but writing to the default exchange (amq.default, as
	// permissions name it): the queues may be declared and bound.
	deny := func() {
		node.Ctl(t, "set_permissions", "-p", "/", user, ".*", "^(berth_rmqtest_.*|berth\\.dlx)$", ".*")
	}
	deny()
	url := strings.Replace(node.URL, "guest:guest", user+":pw", 1)
	fast := sdk.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	admin := newBroker(t, node.URL, Options{Logger: quiet})

	for _, c := range []struct {
		name      string
		noDeclare bool
	}{{"declare", false}, {"nodeclare", true}} {
		t.Run(c.name, func(t *testing.T) {
			deny()
			q := "berth_rmqtest_nowrite_" + c.name
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if c.noDeclare {
				if err := admin.DeclareQueue(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			b := newBroker(t, url, Options{Logger: quiet, NoDeclare: c.noDeclare, Reconnect: fast})

			m := &sdk.Message{Body: []byte("x")}
			err := b.Publish(ctx, q, m, &sdk.Message{Body: []byte("y")})
			var pe *sdk.PublishError
			if !errors.As(err, &pe) || !refusedPublish(pe.Failed[m.ID]) || ctx.Err() != nil {
				t.Fatalf("Publish the login may not make: %v, want a *sdk.PublishError holding the server's 403, not ErrUnavailable", err)
			}
			// A second Publish, on a new channel, is refused again.
			if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("z")}); !refusedPublish(err) {
				t.Fatalf("second Publish: %v, want the 403 again", err)
			}
			res, err := b.PublishAsync(ctx, q, &sdk.Message{Body: []byte("a")})
			if err == nil {
				err = res.Wait(ctx)
			}
			if !refusedPublish(err) {
				t.Fatalf("PublishAsync: %v, want the 403, not ErrUnavailable", err)
			}
			info, err := admin.Info(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if info.Ready != 0 {
				t.Fatalf("the queue holds %d messages after refused publishes, want 0", info.Ready)
			}

			// Permission granted: the next Publish goes through.
			node.Ctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
			if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("ok")}); err != nil {
				t.Fatalf("Publish once the login may write: %v", err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := admin.DeleteQueue(ctx, q); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRetryCopyAccessRefused: a Retry whose copy the login may not
// publish (403 on the default exchange) fails with the server's refusal,
// not ErrUnavailable, once its ctx ends, and the delivery goes back to the
// queue: nothing is lost.
func TestRetryCopyAccessRefused(t *testing.T) {
	node := integration.StartRabbitMQ(t)
	user := "berthnoretry_" + sdk.NewID()
	url := node.User(t, user, ".*", "^(berth_rmqtest_.*|berth\\.dlx)$", ".*")
	t.Cleanup(func() { node.Ctl(t, "delete_user", user) })
	q := "berth_rmqtest_noretry"
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	admin := newBroker(t, node.URL, Options{Logger: quiet})
	m := &sdk.Message{Body: []byte("x")}
	if err := admin.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, url, Options{Logger: quiet, Reconnect: sdk.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	err = ds[0].Retry(sctx, 0, errors.New("boom"))
	scancel()
	// The last attempt may be cut short by sctx (ErrUnavailable): the
	// refusal then comes first, joined with it.
	refusal := err
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		refusal = j.Unwrap()[0]
	}
	if !refusedPublish(refusal) {
		t.Fatalf("Retry whose copy the login may not publish: %v, want the server's 403, not ErrUnavailable", err)
	}
	ds, err = b.Receive(ctx, q, 1)
	if err != nil || ds[0].Message().ID != m.ID {
		t.Fatalf("after the refused Retry: %v, want the message back", err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
}
