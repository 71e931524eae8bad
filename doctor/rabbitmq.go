package doctor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/sdk"
)

// rabbitBroker is what the RabbitMQ checks use of a broker.
type rabbitBroker interface {
	QueueArguments(ctx context.Context, queue string) (map[string]any, error)
	Info(ctx context.Context, queue string) (rabbitmq.QueueInfo, error)
	ServerVersion(ctx context.Context) (string, error)
	ExchangeExists(ctx context.Context, name string) (bool, error)
}

func asRabbit(b sdk.Broker) rabbitBroker {
	var rb *rabbitmq.Broker
	if as, ok := b.(interface{ As(any) bool }); ok && as.As(&rb) {
		return rb
	}
	if rb, ok := b.(*rabbitmq.Broker); ok {
		return rb
	}
	return nil
}

// RabbitMQ runs the RabbitMQ checks on each of opts.Queues:
// rabbitmq.queue-missing, rabbitmq.queue-arguments (info: doctor's login
// may not declare the queue, so its arguments are not read and the checks
// that need them do not run), rabbitmq.queue-type, rabbitmq.dead-letter-exchange,
// rabbitmq.dead-letter-queue, rabbitmq.delivery-limit,
// rabbitmq.queue-limits, rabbitmq.consumer-timeout, rabbitmq.prefetch,
// rabbitmq.delay-queues. Queue arguments are read without the management
// plugin ([rabbitmq.Broker.QueueArguments]), so policies are not seen, nor
// bindings (only that the dead-letter exchange exists,
// [rabbitmq.Broker.ExchangeExists]); the
// server's version comes from its connection properties
// ([rabbitmq.Broker.ServerVersion]). Each queue's checks are bounded by
// Options.CheckTimeout (doctor.check-timeout).
func RabbitMQ(ctx context.Context, b *rabbitmq.Broker, opts Options) ([]Finding, error) {
	fs, err := rabbitMQ(ctx, b, opts.withDefaults())
	Sort(fs)
	return fs, err
}

func rabbitMQ(ctx context.Context, b rabbitBroker, o Options) ([]Finding, error) {
	if len(o.Queues) == 0 {
		return nil, ErrNoQueues
	}
	var fs []Finding
	fs = append(fs, prefetch(o)...)
	// The version decides what a quorum queue without x-delivery-limit
	// does; unknown, it is read as older than 4.0 (and the evidence says so).
	var version serverVersion
	v, err := within(ctx, o.CheckTimeout, b.ServerVersion)
	switch {
	case err == nil:
		version.announced = v
	case timedOut(ctx, err):
		version.unread = fmt.Errorf("timed out: %w", err)
	default:
		return fs, fmt.Errorf("doctor: rabbitmq: server version: %w", err)
	}
	// The delay queues are those of the broker's buckets, which its
	// Options may set.
	buckets := rabbitmq.DefaultDelayBuckets
	if db, ok := b.(interface{ DelayBuckets() []time.Duration }); ok {
		buckets = db.DelayBuckets()
	}
	for _, q := range o.Queues {
		tb := &tracedRabbit{rabbitBroker: b}
		qf, err := bounded(ctx, o, "RabbitMQ checks of the queue", q, func(ctx context.Context) ([]Finding, error) {
			return rabbitQueue(ctx, tb, q, version, buckets, o)
		})
		if err != nil {
			return fs, err
		}
		if call := tb.waiting(); call != "" && len(qf) == 1 && qf[0].ID == checkTimeoutID {
			qf[0].Evidence = "waiting for " + call + ": " + qf[0].Evidence
		}
		fs = append(fs, qf...)
	}
	return fs, nil
}

// tracedRabbit records the call of a rabbitBroker in flight, so that a
// check left waiting on one (amqp091's calls take no context: they cannot
// return an error naming themselves) can say which. The abandoned check
// goroutine writes it while rabbitMQ reads it: an atomic.
type tracedRabbit struct {
	rabbitBroker
	call atomic.Pointer[string]
}

// trace records call as in flight and returns the function that clears it.
func (t *tracedRabbit) trace(call string) func() {
	p := &call
	t.call.Store(p)
	return func() { t.call.CompareAndSwap(p, nil) }
}

// waiting returns the call in flight, "" when none.
func (t *tracedRabbit) waiting() string {
	if p := t.call.Load(); p != nil {
		return *p
	}
	return ""
}

func (t *tracedRabbit) QueueArguments(ctx context.Context, queue string) (map[string]any, error) {
	defer t.trace(fmt.Sprintf("the arguments of queue %s (queue.declare)", quoted(queue)))()
	return t.rabbitBroker.QueueArguments(ctx, queue)
}

func (t *tracedRabbit) Info(ctx context.Context, queue string) (rabbitmq.QueueInfo, error) {
	defer t.trace(fmt.Sprintf("the counts of queue %s (queue.declare, passive)", quoted(queue)))()
	return t.rabbitBroker.Info(ctx, queue)
}

func (t *tracedRabbit) ExchangeExists(ctx context.Context, name string) (bool, error) {
	defer t.trace(fmt.Sprintf("the exchange %s (exchange.declare, passive)", quoted(name)))()
	return t.rabbitBroker.ExchangeExists(ctx, name)
}

func rabbitQueue(ctx context.Context, b rabbitBroker, q string, version serverVersion, buckets []time.Duration, o Options) ([]Finding, error) {
	var fs []Finding
	add := func(f Finding) { f.Queue = q; fs = append(fs, f) }
	args, err := b.QueueArguments(ctx, q)
	if errors.Is(err, sdk.ErrNotFound) {
		add(Finding{ID: "rabbitmq.queue-missing", Severity: Error, Summary: "the queue does not exist",
			Evidence: fmt.Sprintf("queue.declare (passive) of %s: not found", quoted(q)),
			Fix:      "declare it with berth (DeclareQueue, or a Worker/publisher without no_declare) so it gets its dead-letter queue and arguments"})
		return fs, nil
	}
	if accessRefused(err) {
		// The queue exists (its passive declare passed); reading its
		// arguments takes a queue.declare, which needs the configure
		// permission.
		add(Finding{ID: "rabbitmq.queue-arguments", Severity: Info, Summary: "the queue's arguments could not be read (doctor's login may not declare it): its type, dead-lettering, delivery limit, limits, consumer timeout and delay queues are not checked",
			Evidence: err.Error(), Fix: "run doctor as a login with the configure permission on the queue and its .dlq and .delay queues (the one that declares them): reading the arguments redeclares a queue with its own, which changes nothing"})
		return fs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("doctor: rabbitmq: %w", err)
	}
	ev := "arguments " + argsText(args)

	qtype, _ := args["x-queue-type"].(string)
	if qtype == "" {
		qtype = "classic"
	}
	switch qtype {
	case "quorum":
		add(Finding{ID: "rabbitmq.queue-type", Severity: OK, Summary: "quorum queue (replicated, with a delivery limit)", Evidence: ev})
	case "classic":
		add(Finding{ID: "rabbitmq.queue-type", Severity: Warn, Summary: "classic queue: no delivery limit and no replication",
			Evidence: ev, Fix: "move to a quorum queue (berth's default, queue_type=quorum): declare a new queue and shovel the messages, a queue's type cannot change"})
	default:
		add(Finding{ID: "rabbitmq.queue-type", Severity: Warn, Summary: qtype + " queue: berth declares quorum or classic queues",
			Evidence: ev, Fix: "use a quorum queue"})
	}

	dlx, hasDLX := args["x-dead-letter-exchange"].(string)
	rk, hasRK := args["x-dead-letter-routing-key"]
	dlq := rabbitmq.DeadLetterQueue(q)
	switch {
	case hasDLX && dlx == "" && rk == dlq:
		// The default exchange ("") routes by queue name: straight to
		// <queue>.dlq.
		add(Finding{ID: "rabbitmq.dead-letter-exchange", Severity: OK, Summary: "dead letters go to " + dlq + " through the default exchange", Evidence: ev})
	case dlx == "":
		add(Finding{ID: "rabbitmq.dead-letter-exchange", Severity: Error, Summary: "no dead-letter exchange: messages the server drops (delivery limit, rejection) are lost",
			Evidence: ev + policyNote, Fix: fmt.Sprintf("redeclare the queue with x-dead-letter-exchange %s and x-dead-letter-routing-key %s (berth DeclareQueue), or set a policy", quoted(rabbitmq.DefaultDeadLetterExchange), quoted(q))})
	case hasRK && rk != q:
		// The dead-letter exchange routes to <queue>.dlq by the queue's
		// name: the server's dead letters sent with another key reach no
		// queue, or another queue's dead letters.
		add(Finding{ID: "rabbitmq.dead-letter-exchange", Severity: Error,
			Summary:  fmt.Sprintf("the server's dead letters go to exchange %s with routing key %v, not the queue's name: they do not reach %s (dropped, or filed with another queue's)", dlx, rk, dlq),
			Evidence: ev, Fix: fmt.Sprintf("redeclare the queue with x-dead-letter-routing-key %s (berth DeclareQueue; arguments cannot change on a queue that exists: declare a new one and shovel the messages)", quoted(q))})
	default:
		// The server drops dead letters sent to an exchange that does
		// not exist, and says nothing.
		exists, err := b.ExchangeExists(ctx, dlx)
		if err != nil {
			return nil, fmt.Errorf("doctor: rabbitmq: %w", err)
		}
		if !exists {
			add(Finding{ID: "rabbitmq.dead-letter-exchange", Severity: Error, Summary: "the dead-letter exchange does not exist: messages the server drops (delivery limit, rejection) are lost",
				Evidence: ev + fmt.Sprintf("; exchange %s not found", quoted(dlx)),
				Fix:      fmt.Sprintf("declare the exchange %s (direct, durable) and bind %s to it with routing key %s (berth DeclareQueue does both for the broker's dead-letter exchange)", quoted(dlx), quoted(dlq), quoted(q))})
			break
		}
		add(Finding{ID: "rabbitmq.dead-letter-exchange", Severity: OK, Summary: "dead letters go to exchange " + dlx, Evidence: ev})
	}

	if _, err := b.QueueArguments(ctx, dlq); errors.Is(err, sdk.ErrNotFound) {
		add(Finding{ID: "rabbitmq.dead-letter-queue", Severity: Error, Summary: "the dead-letter queue does not exist: dead letters are dropped",
			Evidence: fmt.Sprintf("queue %s not found", quoted(dlq)), Fix: fmt.Sprintf("declare %s bound to the dead-letter exchange with routing key %s (berth DeclareQueue does)", quoted(dlq), quoted(q))})
	} else if err != nil && !accessRefused(err) { // refused after its passive declare passed: it exists
		return nil, fmt.Errorf("doctor: rabbitmq: %w", err)
	} else {
		add(Finding{ID: "rabbitmq.dead-letter-queue", Severity: OK, Summary: "the dead-letter queue exists", Evidence: "queue " + dlq})
	}

	add(deliveryLimit(qtype, args, version, o))
	for _, f := range queueLimits(args) {
		add(f)
	}

	if ct, ok := args["x-consumer-timeout"].(int64); ok {
		d := time.Duration(ct) * time.Millisecond
		if o.LongestJob < 0 || d < o.LongestJob { // negative: jobs without a time limit
			longest := o.LongestJob.String()
			if o.LongestJob < 0 {
				longest = "unbounded (no job timeout)"
			}
			add(Finding{ID: "rabbitmq.consumer-timeout", Severity: Error, Summary: "the queue's consumer timeout is shorter than the longest job",
				Evidence: fmt.Sprintf("x-consumer-timeout %s < longest job %s", d, longest), Fix: "raise x-consumer-timeout above the longest job, or lower WorkerOptions.Timeout"})
		} else {
			add(Finding{ID: "rabbitmq.consumer-timeout", Severity: OK, Summary: "the queue's consumer timeout covers the longest job",
				Evidence: fmt.Sprintf("x-consumer-timeout %s ≥ longest job %s", d, o.LongestJob)})
		}
	} else {
		sev := Info
		if o.LongestJob > sdk.DefaultTimeout || o.LongestJob < 0 {
			sev = Warn
		}
		add(Finding{ID: "rabbitmq.consumer-timeout", Severity: sev, Summary: "consumer_timeout is a server setting AMQP does not show: not checkable here",
			Evidence: fmt.Sprintf("no x-consumer-timeout argument; the server default is 30 min; longest job %s", o.LongestJob),
			Fix:      "check consumer_timeout in rabbitmq.conf (rabbitmqctl eval 'application:get_env(rabbit, consumer_timeout).') is above the longest job; a hung consumer's channel is closed after it"})
	}

	var present, wrong, unread []string
	for _, ttl := range buckets {
		name := rabbitmq.DelayQueue(q, ttl)
		dargs, err := b.QueueArguments(ctx, name)
		if errors.Is(err, sdk.ErrNotFound) {
			continue
		}
		if accessRefused(err) {
			unread = append(unread, name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("doctor: rabbitmq: %w", err)
		}
		present = append(present, name)
		rk, _ := dargs["x-dead-letter-routing-key"].(string)
		ttlArg, _ := dargs["x-message-ttl"].(int64)
		// The default exchange ("") routes by queue name; any other (the
		// dead-letter exchange, bound to <queue>.dlq by the same key)
		// sends every retry elsewhere when its delay ends.
		dlx, hasDLX := dargs["x-dead-letter-exchange"].(string)
		if !hasDLX || dlx != "" || rk != q || ttlArg != ttl.Milliseconds() {
			wrong = append(wrong, fmt.Sprintf("%s (%s)", name, argsText(dargs)))
		}
	}
	switch {
	case len(wrong) > 0:
		add(Finding{ID: "rabbitmq.delay-queues", Severity: Error, Summary: "delay queues do not route retries back to the queue",
			Evidence: strings.Join(wrong, "; "), Fix: fmt.Sprintf("delete them (empty) and let berth redeclare them: x-message-ttl the bucket, x-dead-letter-exchange \"\", x-dead-letter-routing-key %s", quoted(q))})
	case len(unread) > 0:
		add(Finding{ID: "rabbitmq.delay-queues", Severity: Info, Summary: "delay queues whose arguments could not be read (doctor's login may not declare them): not checked",
			Evidence: fmt.Sprintf("%d of %d delay queues exist, %d unread: %s", len(present)+len(unread), len(buckets), len(unread), strings.Join(unread, ", ")),
			Fix:      "run doctor as a login with the configure permission on them (the one that declares them)"})
	case len(present) == 0:
		add(Finding{ID: "rabbitmq.delay-queues", Severity: Info, Summary: "no delay queue yet: berth declares each on its first Retry or delayed publish",
			Evidence: fmt.Sprintf("none of the %d delay queues exists", len(buckets)), Fix: "nothing to do unless the application's user cannot declare queues (then declare them ahead)"})
	default:
		add(Finding{ID: "rabbitmq.delay-queues", Severity: OK, Summary: "the delay queues present route back to the queue",
			Evidence: fmt.Sprintf("%d of %d delay queues exist", len(present), len(buckets))})
	}
	return fs, nil
}

// accessRefused reports whether err is the server's 403 ACCESS_REFUSED:
// the login may not do what was asked (a queue.declare without the
// configure permission).
func accessRefused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// policyNote qualifies a missing argument: AMQP shows a queue's arguments,
// not the policies that may set the same thing.
const policyNote = " (queue arguments only: a policy may set it, which AMQP cannot see; rabbitmqctl list_policies tells)"

// prefetch compares the consumer prefetch with the Workers' capacity,
// Concurrency + their Prefetch (o.WorkerPrefetch), which an sdk.Worker
// tells its Receives (sdk.WithReceiveCapacity). With no prefetch in the URL
// the broker's consumer takes that capacity, at most
// rabbitmq.DefaultPrefetch; a URL's prefetch is taken as it is.
func prefetch(o Options) []Finding {
	capacity := o.Concurrency + o.WorkerPrefetch
	sum := fmt.Sprintf("Concurrency %d + Prefetch %d = %d", o.Concurrency, o.WorkerPrefetch, capacity)
	switch {
	case o.Prefetch == 0 && o.Concurrency > rabbitmq.DefaultPrefetch:
		return []Finding{{ID: "rabbitmq.prefetch", Severity: Warn, Summary: "automatic prefetch capped below the Worker's concurrency: handlers sit idle",
			Evidence: fmt.Sprintf("prefetch follows the Worker's capacity (%s), capped at %d < Concurrency %d", sum, rabbitmq.DefaultPrefetch, o.Concurrency),
			Fix:      fmt.Sprintf("set the URL's prefetch between Concurrency (%d) and Concurrency + Prefetch (%d), or lower Concurrency to %d", o.Concurrency, capacity, rabbitmq.DefaultPrefetch)}}
	case o.Prefetch == 0 && capacity > rabbitmq.DefaultPrefetch:
		return []Finding{{ID: "rabbitmq.prefetch", Severity: OK, Summary: "automatic prefetch: the Worker's capacity",
			Evidence: fmt.Sprintf("prefetch follows the Worker's capacity (%s), capped at %d", sum, rabbitmq.DefaultPrefetch)}}
	case o.Prefetch == 0:
		return []Finding{{ID: "rabbitmq.prefetch", Severity: OK, Summary: "automatic prefetch: the Worker's capacity",
			Evidence: fmt.Sprintf("prefetch follows the Worker's capacity (%s), at most %d", sum, rabbitmq.DefaultPrefetch)}}
	case o.Prefetch < o.Concurrency:
		return []Finding{{ID: "rabbitmq.prefetch", Severity: Warn, Summary: "prefetch below the Worker's concurrency: handlers sit idle",
			Evidence: fmt.Sprintf("prefetch %d < Concurrency %d", o.Prefetch, o.Concurrency), Fix: fmt.Sprintf("drop the prefetch parameter (automatic) or raise it to Concurrency + Prefetch (%d)", capacity)}}
	case o.Prefetch > capacity:
		return []Finding{{ID: "rabbitmq.prefetch", Severity: Warn, Summary: "prefetch above the Worker's capacity: messages wait in one process while others idle, and count against consumer_timeout",
			Evidence: fmt.Sprintf("prefetch %d > %s", o.Prefetch, sum), Fix: fmt.Sprintf("drop the prefetch parameter (automatic) or lower it to Concurrency + Prefetch (%d)", capacity)}}
	}
	return []Finding{{ID: "rabbitmq.prefetch", Severity: OK, Summary: "prefetch fits the Worker's capacity",
		Evidence: fmt.Sprintf("Concurrency %d ≤ prefetch %d ≤ Concurrency + Prefetch %d", o.Concurrency, o.Prefetch, capacity)}}
}

func argsText(args map[string]any) string {
	if len(args) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, args[k])
	}
	return strings.Join(parts, " ")
}
