package doctor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	bjs "github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// jsConsumer is the durable consumer berth reads a queue's ready messages
// with (brokers/jetstream).
const jsConsumer = "berth"

// jsDelayConsumerName is the durable consumer berth's mover reads a queue's
// delayed messages with (brokers/jetstream).
const jsDelayConsumerName = "berth-delay"

func asJetStream(b sdk.Broker) *bjs.Broker {
	var jb *bjs.Broker
	if as, ok := b.(interface{ As(any) bool }); ok && as.As(&jb) {
		return jb
	}
	jb, _ = b.(*bjs.Broker)
	return jb
}

// JetStream runs the JetStream checks on each queue (opts.Queues, else every
// queue the broker lists): jetstream.stream-missing, jetstream.retention
// (a work-queue stream), jetstream.stream-limits (no MaxAge, MaxMsgs,
// MaxBytes or MaxMsgsPerSubject, which drop jobs or refuse publishes),
// jetstream.dead-letter-stream (present, not an interest stream, which drops
// a dead letter no consumer waits for, keeping dead letters as long as the
// queue keeps jobs) and jetstream.consumer (berth's durable consumer:
// explicit acks, its AckWait the broker's, no server MaxDeliver below
// MaxAttempts — an error — nor at or below the broker's poison cap
// MaxDeliveries, which then never gets the delivery it dead-letters at — a
// warning; and the delay consumer "berth-delay": present, explicit acks, no
// MaxDeliver, which strands delayed jobs — an error).
func JetStream(ctx context.Context, b *bjs.Broker, opts Options) ([]Finding, error) {
	fs, err := jetStream(ctx, b, opts.withDefaults())
	Sort(fs)
	return fs, err
}

func jetStream(ctx context.Context, b *bjs.Broker, o Options) ([]Finding, error) {
	qs, err := within(ctx, o.CheckTimeout, func(ctx context.Context) ([]string, error) { return queues(ctx, b, o) })
	if timedOut(ctx, err) {
		return []Finding{timeoutFinding(ctx, o, "JetStream stream listing", "", err)}, nil
	}
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(b.Conn())
	if err != nil {
		return nil, fmt.Errorf("doctor: jetstream: %w", err)
	}
	var fs []Finding
	for _, q := range qs {
		qf, err := bounded(ctx, o, "JetStream checks of the queue", q, func(ctx context.Context) ([]Finding, error) {
			return jsQueue(ctx, js, b, q, o)
		})
		if err != nil {
			return fs, err
		}
		fs = append(fs, qf...)
	}
	return fs, nil
}

func jsQueue(ctx context.Context, js jetstream.JetStream, b *bjs.Broker, q string, o Options) ([]Finding, error) {
	var fs []Finding
	add := func(f Finding) { f.Queue = q; fs = append(fs, f) }
	name, dlqName := b.StreamNames(q)
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		add(Finding{ID: "jetstream.stream-missing", Severity: Error, Summary: "the queue's stream does not exist",
			Evidence: "stream " + name + " not found", Fix: "declare the queue with berth (DeclareQueue, or a Worker without no_declare)"})
		return fs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("doctor: jetstream: stream %s: %w", name, err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Retention != jetstream.WorkQueuePolicy {
		add(Finding{ID: "jetstream.retention", Severity: Error, Summary: "the stream is not a work queue: acked jobs stay, and another consumer would see them again",
			Evidence: fmt.Sprintf("stream %s retention %s", name, cfg.Retention), Fix: "recreate it as a work-queue stream (berth DeclareQueue); retention cannot change on an existing stream"})
	} else {
		add(Finding{ID: "jetstream.retention", Severity: OK, Summary: "work-queue stream: an acked job is removed", Evidence: "stream " + name})
	}
	limits := fmt.Sprintf("MaxAge %s, MaxMsgs %d, MaxBytes %d, MaxMsgsPerSubject %d, discard %s", cfg.MaxAge, cfg.MaxMsgs, cfg.MaxBytes, cfg.MaxMsgsPerSubject, cfg.Discard)
	if cfg.DiscardNewPerSubject {
		limits += " (per subject too)"
	}
	if cfg.MaxAge > 0 || cfg.MaxMsgs > 0 || cfg.MaxBytes > 0 || cfg.MaxMsgsPerSubject > 0 {
		sev := Warn
		// Every ready job of the queue is on one subject: a per-subject
		// limit drops the older ones unless discard new applies per
		// subject too. MaxAge removes a job older than it whatever the
		// discard policy, which governs only the count and size limits.
		if cfg.Discard == jetstream.DiscardOld || (cfg.MaxMsgsPerSubject > 0 && !cfg.DiscardNewPerSubject) || cfg.MaxAge > 0 {
			sev = Error
		}
		add(Finding{ID: "jetstream.stream-limits", Severity: sev, Summary: "the stream has limits: jobs past them are dropped (MaxAge, discard old) or publishes refused (discard new)",
			Evidence: limits, Fix: "remove the limits (berth declares none) or size them far above the backlog, with discard new so producers see the refusal; remove MaxAge, which deletes the jobs that wait longer whatever the discard policy"})
	} else {
		add(Finding{ID: "jetstream.stream-limits", Severity: OK, Summary: "no limit drops jobs", Evidence: limits})
	}

	dst, err := js.Stream(ctx, dlqName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		add(Finding{ID: "jetstream.dead-letter-stream", Severity: Error, Summary: "the dead-letter stream does not exist: dead letters cannot be stored",
			Evidence: "stream " + dlqName + " not found", Fix: "declare the queue with berth (DeclareQueue)"})
	case err != nil:
		return nil, fmt.Errorf("doctor: jetstream: stream %s: %w", dlqName, err)
	default:
		dcfg := dst.CachedInfo().Config
		ev := fmt.Sprintf("stream %s retention %s, MaxAge %s, MaxMsgs %d, MaxBytes %d; queue stream MaxAge %s", dlqName, dcfg.Retention, dcfg.MaxAge, dcfg.MaxMsgs, dcfg.MaxBytes, cfg.MaxAge)
		if dcfg.Retention == jetstream.InterestPolicy {
			// An interest stream keeps a message only until every
			// consumer acked it: with none, the rule on a dead-letter
			// stream, each dead letter is dropped as it is stored.
			add(Finding{ID: "jetstream.dead-letter-stream", Severity: Error, Summary: "the dead-letter stream has interest retention: a dead letter no consumer waits for is dropped as it is stored",
				Evidence: ev, Fix: "set the dead-letter stream's retention to limits, as berth declares it (NATS 2.10 and later change it in place: nats stream edit --retention limits; before, delete the stream, which holds nothing, and let berth DeclareQueue recreate it)"})
		} else if (dcfg.MaxAge > 0 && (cfg.MaxAge == 0 || dcfg.MaxAge < cfg.MaxAge)) || dcfg.MaxMsgs > 0 || dcfg.MaxBytes > 0 {
			add(Finding{ID: "jetstream.dead-letter-stream", Severity: Warn, Summary: "dead letters expire or are dropped before anyone looks at them",
				Evidence: ev, Fix: "remove the dead-letter stream's limits (berth declares none), or keep them longer than the queue keeps jobs"})
		} else {
			add(Finding{ID: "jetstream.dead-letter-stream", Severity: OK, Summary: "dead letters are kept until handled", Evidence: ev})
		}
	}

	cf, err := jsReadyConsumer(ctx, st, b, name, o)
	if err != nil {
		return nil, err
	}
	df, err := jsDelayConsumer(ctx, st, name)
	if err != nil {
		return nil, err
	}
	switch {
	case df == nil:
		add(cf)
	case cf.Severity == OK:
		add(*df)
	default:
		add(cf)
		add(*df)
	}
	return fs, nil
}

// jsReadyConsumer checks berth's durable consumer of the ready subject.
func jsReadyConsumer(ctx context.Context, st jetstream.Stream, b *bjs.Broker, name string, o Options) (Finding, error) {
	c, err := st.Consumer(ctx, jsConsumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return Finding{ID: "jetstream.consumer", Severity: Error, Summary: "berth's durable consumer does not exist: no Worker can receive",
			Evidence: fmt.Sprintf("consumer %q of stream %s not found", jsConsumer, name), Fix: "declare the queue with berth (DeclareQueue)"}, nil
	}
	if err != nil {
		return Finding{}, fmt.Errorf("doctor: jetstream: consumer of %s: %w", name, err)
	}
	cc := c.CachedInfo().Config
	want := b.Options().AckWait
	poisonCap := b.MaxDeliveries()
	ev := fmt.Sprintf("consumer %q: ack policy %s, AckWait %s (the broker's %s), MaxDeliver %d; Workers' MaxAttempts %d, broker MaxDeliveries %d",
		jsConsumer, cc.AckPolicy, cc.AckWait, want, cc.MaxDeliver, o.MaxAttempts, poisonCap)
	switch {
	case cc.AckPolicy != jetstream.AckExplicitPolicy:
		return Finding{ID: "jetstream.consumer", Severity: Error, Summary: "the consumer does not use explicit acks: jobs are removed before they ran", Evidence: ev,
			Fix: "delete the consumer and let berth recreate it (DeclareQueue)"}, nil
	case cc.MaxDeliver > 0 && cc.MaxDeliver < o.MaxAttempts:
		return Finding{ID: "jetstream.consumer", Severity: Error, Summary: "the server stops delivering a job before the Worker's last attempt: it is neither retried nor dead-lettered, only stuck", Evidence: ev,
			Fix: "set the consumer's MaxDeliver to -1 (berth counts deliveries itself: broker MaxDeliveries) by redeclaring it"}, nil
	case cc.AckWait < want:
		return Finding{ID: "jetstream.consumer", Severity: Error, Summary: "the consumer's AckWait is shorter than the broker's: the server redelivers jobs berth still holds", Evidence: ev,
			Fix: fmt.Sprintf("redeclare the consumer (DeclareQueue) with AckWait %s, or give the broker the consumer's (ack_wait=%s)", want, cc.AckWait.Round(time.Millisecond))}, nil
	case cc.MaxDeliver > 0 && cc.MaxDeliver <= poisonCap:
		// berth dead-letters a poison message at the receive of its
		// delivery MaxDeliveries+1 (brokers/jetstream): a server that
		// stops before it leaves a job that kills its worker in the
		// stream, never dead-lettered.
		return Finding{ID: "jetstream.consumer", Severity: Warn, Summary: "the server stops delivering a job before berth's poison cap can dead-letter it: a job that crashes its worker stays stuck in the stream", Evidence: ev,
			Fix: fmt.Sprintf("set the consumer's MaxDeliver to -1 (or above the broker's MaxDeliveries, %d) by redeclaring it", poisonCap)}, nil
	default:
		return Finding{ID: "jetstream.consumer", Severity: OK, Summary: "the consumer matches the broker", Evidence: ev}, nil
	}
}

// jsDelayConsumer checks berth's durable consumer of the delayed subject
// ("berth-delay"), which the broker's mover reads to move delayed publishes
// and retries to the ready subject when due, nak'ing each until then: a nak
// counts a delivery, so any server MaxDeliver strands a job that runs out of
// it in the stream, neither ready nor dead-lettered. It returns nil when the
// consumer is fine.
func jsDelayConsumer(ctx context.Context, st jetstream.Stream, name string) (*Finding, error) {
	c, err := st.Consumer(ctx, jsDelayConsumerName)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return &Finding{ID: "jetstream.consumer", Severity: Error, Summary: "berth's delay consumer does not exist: delayed jobs and retries never become ready",
			Evidence: fmt.Sprintf("consumer %q of stream %s not found", jsDelayConsumerName, name), Fix: "declare the queue with berth (DeclareQueue)"}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("doctor: jetstream: delay consumer of %s: %w", name, err)
	}
	cc := c.CachedInfo().Config
	ev := fmt.Sprintf("consumer %q: ack policy %s, MaxDeliver %d", jsDelayConsumerName, cc.AckPolicy, cc.MaxDeliver)
	switch {
	case cc.AckPolicy != jetstream.AckExplicitPolicy:
		return &Finding{ID: "jetstream.consumer", Severity: Error, Summary: "the delay consumer does not use explicit acks: a delayed job is removed before it is due", Evidence: ev,
			Fix: "delete the consumer and let berth recreate it (DeclareQueue)"}, nil
	case cc.MaxDeliver > 0:
		return &Finding{ID: "jetstream.consumer", Severity: Error, Summary: "the delay consumer has a MaxDeliver: each wait for a delayed job or retry counts a delivery, and a job past it stays in the stream, never ready", Evidence: ev,
			Fix: "set the delay consumer's MaxDeliver to -1 by redeclaring it (DeclareQueue)"}, nil
	}
	return nil, nil
}
