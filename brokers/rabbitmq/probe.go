package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// inequivalent parses RabbitMQ's PRECONDITION_FAILED text for a queue
// declared with other arguments than it has: the argument's name and its
// current value ("none", "'v'", or "the value 'v' of type 't'").
var inequivalent = regexp.MustCompile(`inequivalent arg '([^']+)' for queue .* but current is (none|the value '([^']*)' of type '([^']+)'|'([^']*)')`)

// maxProbes bounds QueueArguments: one declare per argument the queue has.
const maxProbes = 32

// queueProperties are the names PRECONDITION_FAILED gives the properties of
// queue.declare that are not arguments ("inequivalent arg 'durable' for
// queue ... received 'true' but current is 'false'").
var queueProperties = map[string]bool{"durable": true, "auto_delete": true, "exclusive": true}

// QueueArguments returns the arguments queue was declared with (x-queue-type,
// x-dead-letter-exchange, x-delivery-limit, x-message-ttl, …) as far as the
// server checks them on a redeclare, without the management plugin: it
// declares the queue with the arguments found so far and reads the one the
// server says differs from its PRECONDITION_FAILED answer, until the
// declare succeeds. A declare that succeeds with the queue's own arguments
// changes nothing. A queue that does not exist is never created: it is
// checked with a passive declare first (an error wrapping [sdk.ErrNotFound]).
// A queue's type is read even where the vhost's default queue type gives
// it to a declare without x-queue-type (the probe asks for "classic"
// explicitly); x-queue-type classic is reported only where the vhost's
// default is another type.
// Arguments the server does not compare on a redeclare (x-delivery-limit of
// a classic queue, which RabbitMQ ignores anyway) are not reported. A
// queue that is not durable, or is auto-delete, which berth never declares
// (its declarations of such a queue fail with PRECONDITION_FAILED), gives
// an error naming that property at the first probe. berth doctor uses it.
func (b *Broker) QueueArguments(ctx context.Context, queue string) (map[string]any, error) {
	if b.closed() {
		return nil, sdk.ErrClosed
	}
	if _, err := b.inspect(ctx, queue); err != nil {
		return nil, fmt.Errorf("rabbitmq: inspect %q: %w", queue, err)
	}
	args := amqp.Table{}
	// A declare without x-queue-type gets the vhost's default queue type
	// (quorum where the vhost says so), this probe's too: a quorum queue
	// declared without it, in such a vhost, would pass for a classic one.
	// Once the declare succeeds without it, it is asked for "classic"
	// explicitly, which the server refuses naming the type when it is
	// another.
	askedType := false
	for range maxProbes {
		err := b.withChannel(ctx, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, args)
			return err
		})
		if err == nil && !askedType {
			if _, ok := args["x-queue-type"]; !ok {
				askedType = true
				args["x-queue-type"] = string(Classic)
				continue
			}
		}
		if err == nil {
			if askedType && args["x-queue-type"] == string(Classic) {
				delete(args, "x-queue-type") // classic, the default: as before, not reported
			}
			out := make(map[string]any, len(args))
			for k, v := range args {
				out[k] = v
			}
			return out, nil
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return nil, fmt.Errorf("rabbitmq: probe arguments of %q: %w", queue, err)
		}
		m := inequivalent.FindStringSubmatch(ae.Reason)
		if m == nil {
			return nil, fmt.Errorf("rabbitmq: probe arguments of %q: unexpected answer: %w", queue, err)
		}
		name := m[1]
		if queueProperties[name] {
			// Not an argument: a property of queue.declare itself, which
			// this probe, like every berth declaration, sends as durable,
			// not auto-delete. Put in args, it would be answered the same
			// way at every probe, until maxProbes.
			return nil, fmt.Errorf("rabbitmq: probe arguments of %q: the queue is declared with %s %s, "+
				"where berth declares its queues durable and not auto-delete: berth's declarations of it fail "+
				"(delete it and let berth declare it): %w", queue, name, m[5], err)
		}
		switch {
		case m[2] == "none":
			delete(args, name)
		case m[4] != "":
			args[name] = typedArg(m[3], m[4])
		default:
			args[name] = sameType(args[name], m[5])
		}
	}
	return nil, fmt.Errorf("rabbitmq: probe arguments of %q: no answer after %d declares", queue, maxProbes)
}

// ExchangeExists reports whether the exchange name exists, with a passive
// exchange.declare: it never creates one. The default exchange ("") always
// exists. berth doctor uses it: the server drops the dead letters of a queue
// whose x-dead-letter-exchange names no exchange, without a word.
func (b *Broker) ExchangeExists(ctx context.Context, name string) (bool, error) {
	if b.closed() {
		return false, sdk.ErrClosed
	}
	if name == "" {
		return true, nil
	}
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(name, amqp.ExchangeDirect, true, false, false, false, nil)
	})
	if errors.Is(err, sdk.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("rabbitmq: inspect exchange %q: %w", name, err)
	}
	return true, nil
}

// typedArg converts an argument's text to the AMQP type the server named.
func typedArg(v, typ string) any {
	switch typ {
	case "long", "signedint", "short", "byte", "unsignedint", "unsignedshort", "unsignedbyte":
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	case "bool":
		return v == "true"
	}
	return v
}

// sameType converts v to the type of the value sent before.
func sameType(sent any, v string) any {
	switch sent.(type) {
	case int64:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	case bool:
		return v == "true"
	}
	return v
}

// DelayBuckets returns the TTLs of the broker's delay queues: its
// [Options.DelayBuckets] (each rounded up to a whole millisecond) or
// [DefaultDelayBuckets], shortest first. berth doctor checks the delay
// queues ([DelayQueue]) of those.
func (b *Broker) DelayBuckets() []time.Duration { return slices.Clone(b.opts.DelayBuckets) }

// ServerVersion returns the version the RabbitMQ server announced in its
// connection.start properties ("3.13.7", "4.0.5") when the broker's
// publishing connection opened, "" when it announced none. berth doctor
// uses it: what a quorum queue without x-delivery-limit does depends on it
// (RabbitMQ 4.0 and later apply a default delivery limit of 20). The text
// comes from the server: escape it before showing it.
func (b *Broker) ServerVersion(ctx context.Context) (string, error) {
	if b.closed() {
		return "", sdk.ErrClosed
	}
	conn, err := b.pub.get(ctx)
	if err != nil {
		return "", err
	}
	v, _ := conn.Properties["version"].(string)
	return v, nil
}
