// Package brokertest is the conformance suite every berth broker runs: one set
// of named cases that checks a broker keeps the [sdk.Delivery] contract of
// ARCHITECTURE.md, "The contract" (leases, attempts, retries, dead letters,
// limits, Close) and that
// the [sdk.Worker] on top of it settles every message exactly once.
//
// A broker's test describes itself with a [Harness] and calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{
//			New: func(t *testing.T) sdk.Broker {
//				b, err := memory.New(memory.Options{Lease: time.Second, MaxDeliveries: 3})
//				if err != nil {
//					t.Fatal(err)
//				}
//				return b
//			},
//			Lease:          time.Second,
//			MaxDeliveries:  3,
//			MaxMessageSize: 1 << 20,
//		})
//	}
//
// Every case is a subtest with a fresh broker and a fresh queue. A case that
// needs a behaviour the broker declares in [Harness.Unsupported] is skipped
// with "unsupported: <reason>"; the hooks some cases need (a second
// instance, a connection to cut, the driver's error type) are Harness fields.
// Timing assertions are only lower bounds ("not
// delivered before d") and generous upper bounds ("eventually, within
// [Harness.Timeout]"), so the suite holds on a loaded machine.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// Capability names an optional behaviour a broker may lack. A harness lists
// the ones its broker lacks in [Harness.Unsupported], each with a reason.
type Capability string

// The capabilities the suite knows.
const (
	// CapLease: an unsettled delivery is redelivered once its lease expires,
	// without [Harness.Abandon] (RabbitMQ redelivers only when the consumer's
	// channel closes).
	CapLease Capability = "lease"
	// CapLeaseLost: settling a delivery whose lease expired (and whose message
	// was delivered again) returns an error wrapping [sdk.ErrLeaseLost].
	CapLeaseLost Capability = "lease-lost"
	// CapExtendLease: ExtendLease keeps a delivery from being redelivered past
	// its original lease.
	CapExtendLease Capability = "extend-lease"
	// CapDelayedPublish: Message.Delay postpones the first delivery.
	CapDelayedPublish Capability = "delayed-publish"
	// CapRetryDelay: Retry(d) is not delivered again before d.
	CapRetryDelay Capability = "retry-delay"
	// CapRelease: deliveries implement [sdk.Releaser].
	CapRelease Capability = "release"
	// CapDeadLetters: the broker implements [sdk.DeadLetters].
	CapDeadLetters Capability = "dead-letters"
	// CapStats: the broker implements [sdk.Inspector] with exact counts.
	CapStats Capability = "stats"
	// CapMaxDeliveries: a message delivered [Harness.MaxDeliveries] times
	// without being settled is dead-lettered with [sdk.ErrMaxDeliveries].
	CapMaxDeliveries Capability = "max-deliveries"
	// CapMaxMessageSize: the broker has a size limit ([Harness.MaxMessageSize])
	// checked before publishing.
	CapMaxMessageSize Capability = "max-message-size"
	// CapNULHeader: header names and values may hold NUL bytes. A broker
	// that cannot store them refuses them with [sdk.ErrInvalidHeader] and
	// stores nothing; the suite checks that instead of skipping.
	CapNULHeader Capability = "nul-header"
	// CapOrderingKey: messages of one [sdk.Message.Key], published in one
	// Publish call, reach a single receiver in publish order (on
	// [Harness.OrderedQueue]'s queue when set).
	CapOrderingKey Capability = "ordering-key"
	// CapPeer: [Harness.Peer] gives a second instance on the same queues, so
	// that work is shared between instances and unsettled deliveries of a
	// closed instance come back to another.
	CapPeer Capability = "peer"
	// CapDriverError: the error of a call on a queue that does not exist
	// carries the driver's own error, found by [Harness.As].
	CapDriverError Capability = "driver-error"
	// CapConnectionLoss: [Harness.Faulty] gives an instance whose connection
	// the test can cut, and the broker recovers from the cut.
	CapConnectionLoss Capability = "connection-loss"
)

var knownCapabilities = map[Capability]bool{
	CapLease: true, CapLeaseLost: true, CapExtendLease: true, CapDelayedPublish: true,
	CapRetryDelay: true, CapRelease: true, CapDeadLetters: true, CapStats: true,
	CapMaxDeliveries: true, CapMaxMessageSize: true, CapNULHeader: true, CapOrderingKey: true,
	CapPeer: true, CapDriverError: true, CapConnectionLoss: true,
}

// Undeclared is what a broker does with a valid queue name that was never
// declared.
type Undeclared int

// The behaviours for a queue that was never declared.
const (
	// UndeclaredNotFound: Publish and Receive return an error wrapping
	// [sdk.ErrNotFound] at once (Receive does not wait for the queue).
	UndeclaredNotFound Undeclared = iota
	// UndeclaredCreated: the queue comes into being on first use: a Receive
	// on it waits, and a message published to it is delivered.
	UndeclaredCreated
)

// Harness describes the broker under test. New is required; the rest have
// defaults.
type Harness struct {
	// New returns a fresh broker for one subtest. The suite closes it at the
	// end of the subtest (Close twice must be safe); New may register its own
	// t.Cleanup for anything else (connections, schemas).
	New func(t *testing.T) sdk.Broker
	// Queue returns a fresh, unique, declared queue (with its dead-letter
	// queue and whatever else the broker needs) and registers its cleanup.
	// Default: "brokertest_<random>", declared through [sdk.QueueDeclarer]
	// when the broker implements it.
	Queue func(t *testing.T, b sdk.Broker) string
	// Lease is the lease every delivery gets from the broker in this harness.
	// Keep it short (0.5–3 s): cases wait for it to expire. Required.
	Lease time.Duration
	// MaxDeliveries is the poison cap the broker was configured with
	// (required unless CapMaxDeliveries is unsupported).
	MaxDeliveries int
	// MaxMessageSize is the broker's size limit in bytes, as [sdk.Message.Size]
	// counts them (required unless CapMaxMessageSize is unsupported).
	MaxMessageSize int
	// Abandon simulates the death of the consumer holding d: RabbitMQ closes
	// the channel it came on. Default: stop touching d and let its lease run out.
	Abandon func(t *testing.T, b sdk.Broker, d sdk.Delivery)
	// Unsupported maps each capability the broker lacks to the reason.
	Unsupported map[Capability]string
	// WorkerMessages is the number of messages of the Worker-level cases.
	// Default 10000.
	WorkerMessages int
	// Timeout bounds every "eventually" of the suite. Default 20s.
	Timeout time.Duration

	// Undeclared is what the broker does with a valid queue name that was
	// never declared. Default [UndeclaredNotFound].
	Undeclared Undeclared
	// NewNoDeclare (optional) returns a broker like New's but configured not
	// to declare queues on first use (RabbitMQ's NoDeclare; PostgreSQL on a
	// schema where Migrate never ran), closed by the suite. The suite
	// checks that it gives [UndeclaredNotFound] behaviour, and it is where
	// [Harness.As] is tried when the broker itself creates queues.
	NewNoDeclare func(t *testing.T) sdk.Broker
	// As reports whether err carries the driver's own error, by calling
	// errors.As with the driver's type (gocloud's ErrorAs): for example
	// *amqp.Error or smithy.APIError. The suite gives it the error of a
	// Receive on a queue that does not exist. Required unless
	// CapDriverError is unsupported.
	As func(err error) bool
	// Peer returns a second instance on the same queues as b (another
	// process's view of the same server, schema or account), closed by the
	// suite. Required unless CapPeer is unsupported.
	Peer func(t *testing.T, b sdk.Broker) sdk.Broker
	// OrderedQueue (optional) returns a fresh queue on b where the broker
	// keeps the order within an ordering key (an SQS FIFO queue), with its
	// cleanup. Default: [Harness.Queue].
	OrderedQueue func(t *testing.T, b sdk.Broker) string
	// Faulty returns a fresh instance whose connection cut severs, as a
	// network failure would (through a fault proxy, or by terminating its
	// server sessions); the broker must recover by itself. The suite closes
	// the instance and declares its queues with [Harness.Queue]. Required
	// unless CapConnectionLoss is unsupported.
	Faulty func(t *testing.T) (b sdk.Broker, cut func())
	// LostReceives, when set, reports whether the broker's server has lost a
	// Receive answer after taking its messages so far in this run (the SQS
	// emulator fauxqs now and then does, and the broker logs it): those
	// messages stay hidden for the lease and come back with Attempt() one
	// higher, though no caller ever saw them. Cases that check an exact
	// Attempt() accept one more only once it reports true; with it nil (the
	// default), or before any loss, they stay exact.
	LostReceives func() bool
}

// Run runs every conformance case against the broker h describes, each as a
// named subtest of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("brokertest: Harness.New is required")
	}
	if h.Lease <= 0 {
		t.Fatal("brokertest: Harness.Lease is required")
	}
	for c, reason := range h.Unsupported {
		if !knownCapabilities[c] {
			t.Fatalf("brokertest: Harness.Unsupported names unknown capability %q", c)
		}
		if reason == "" {
			t.Fatalf("brokertest: Harness.Unsupported[%q] needs a reason", c)
		}
	}
	if h.WorkerMessages <= 0 {
		h.WorkerMessages = 10000
	}
	if h.Timeout <= 0 {
		h.Timeout = 20 * time.Second
	}
	for c, hook := range map[Capability]bool{CapDriverError: h.As != nil, CapPeer: h.Peer != nil, CapConnectionLoss: h.Faulty != nil} {
		if _, unsupported := h.Unsupported[c]; !unsupported && !hook {
			t.Fatalf("brokertest: capability %q needs its Harness hook, or declare it unsupported with a reason", c)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, capability := range c.needs {
				if reason, ok := h.Unsupported[capability]; ok {
					t.Skipf("unsupported: %s (%s)", reason, capability)
				}
			}
			c.run(t, newEnv(t, h))
		})
	}
}

// Names returns the names of the cases [Run] runs, in order.
func Names() []string {
	names := make([]string, len(cases))
	for i, c := range cases {
		names[i] = c.name
	}
	return names
}

// testCase is one named conformance case.
type testCase struct {
	name  string
	needs []Capability
	run   func(t *testing.T, e *env)
}

// env is what a case works with: a fresh broker and queue.
type env struct {
	h Harness
	b sdk.Broker
	q string
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	b := h.New(t)
	t.Cleanup(func() { _ = b.Close() })
	e := &env{h: h, b: b}
	e.q = e.queue(t, b)
	return e
}

// queue returns a fresh declared queue on b, as [Harness.Queue] says.
func (e *env) queue(t *testing.T, b sdk.Broker) string {
	t.Helper()
	if e.h.Queue != nil {
		return e.h.Queue(t, b)
	}
	q := "brokertest_" + randomSuffix()
	if d, ok := b.(sdk.QueueDeclarer); ok {
		ctx, cancel := context.WithTimeout(context.Background(), e.h.Timeout)
		defer cancel()
		if err := d.DeclareQueue(ctx, q); err != nil {
			t.Fatalf("DeclareQueue(%q): %v", q, err)
		}
	}
	return q
}

// randomSuffix returns 12 random hex characters.
func randomSuffix() string {
	var p [6]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}
