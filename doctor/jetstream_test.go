package doctor_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	bjs "github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// openJS opens the NATS server with a prefix of its own, so that Run lists
// only this test's queues; they are deleted when it ends.
func openJS(t *testing.T, queues ...string) (sdk.Broker, *bjs.Broker, jetstream.JetStream) {
	t.Helper()
	u, err := url.Parse(integration.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", "doctor"+suffix())
	u.RawQuery = q.Encode()
	b := open(t, u.String())
	var jb *bjs.Broker
	if as, ok := b.(interface{ As(any) bool }); !ok || !as.As(&jb) {
		if jb, ok = b.(*bjs.Broker); !ok {
			t.Fatalf("%T is not a JetStream broker", b)
		}
	}
	t.Cleanup(func() {
		for _, q := range queues {
			_ = jb.DeleteQueue(context.Background(), q)
		}
	})
	js, err := jetstream.New(jb.Conn())
	if err != nil {
		t.Fatal(err)
	}
	return b, jb, js
}

func TestJetStreamDefaultsPass(t *testing.T) {
	b, jb, _ := openJS(t, "billing", "emails")
	for _, q := range []string{"billing", "emails"} {
		if err := jb.DeclareQueue(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clean(t, fs)
	for _, q := range []string{"billing", "emails"} {
		for _, id := range []string{"jetstream.retention", "jetstream.stream-limits", "jetstream.dead-letter-stream", "jetstream.consumer"} {
			expect(t, fs, id, q, doctor.OK)
		}
	}
}

func TestJetStreamMisconfigured(t *testing.T) {
	b, jb, js := openJS(t, "limited", "capped", "nodlq", "limits")
	ctx := testCtx(t)
	for _, q := range []string{"limited", "capped", "nodlq"} {
		if err := jb.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// limited: an hour's MaxAge, old jobs discarded; its dead letters kept ten minutes
	name, dlq := jb.StreamNames("limited")
	for _, s := range []struct {
		name string
		age  time.Duration
	}{{name, time.Hour}, {dlq, 10 * time.Minute}} {
		st, err := js.Stream(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxAge = s.age
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	// capped: the server gives up after 2 deliveries
	setMaxDeliver(ctx, t, js, jb, "capped", 2)
	// nodlq: its dead-letter stream deleted
	_, dlq = jb.StreamNames("nodlq")
	if err := js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	// limits: a stream of berth's name that is not a work queue
	name, _ = jb.StreamNames("limits")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{jb.Subject("limits")}, Retention: jetstream.LimitsPolicy}); err != nil {
		t.Fatal(err)
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"limited", "capped", "nodlq", "limits", "missing"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.stream-limits", "limited", doctor.Error)
	expect(t, fs, "jetstream.dead-letter-stream", "limited", doctor.Warn)
	expect(t, fs, "jetstream.consumer", "capped", doctor.Error)
	expect(t, fs, "jetstream.dead-letter-stream", "nodlq", doctor.Error)
	expect(t, fs, "jetstream.retention", "limits", doctor.Error)
	expect(t, fs, "jetstream.consumer", "limits", doctor.Error) // never declared by berth: no consumer
	expect(t, fs, "jetstream.stream-missing", "missing", doctor.Error)
}

// TestJetStreamMaxDeliverBelowPoisonCap: berth dead-letters a poison message
// (one that kills its worker, so no attempt reaches a verdict) at the receive
// after its broker MaxDeliveries-th delivery. A server MaxDeliver of at least
// the Workers' MaxAttempts but not above MaxDeliveries stops delivering it
// before that receive: the job stays in the work queue, never dead-lettered.
// Doctor reported it OK.
func TestJetStreamMaxDeliverBelowPoisonCap(t *testing.T) {
	b, jb, js := openJS(t, "poison")
	ctx := testCtx(t)
	if err := jb.DeclareQueue(ctx, "poison"); err != nil {
		t.Fatal(err)
	}
	setMaxDeliver(ctx, t, js, jb, "poison", jb.MaxDeliveries()) // ≥ MaxAttempts (5), but the cap's check needs one more delivery
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"poison"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.consumer", "poison", doctor.Warn)

	setMaxDeliver(ctx, t, js, jb, "poison", jb.MaxDeliveries()+1) // the cap's check is delivered: fine
	if fs, err = doctor.Run(ctx, b, doctor.Options{Queues: []string{"poison"}}); err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.consumer", "poison", doctor.OK)
}

// setMaxDeliver sets the MaxDeliver of berth's consumer on queue's stream,
// as an operator changing it on the server would.
func setMaxDeliver(ctx context.Context, t *testing.T, js jetstream.JetStream, jb *bjs.Broker, queue string, n int) {
	t.Helper()
	setConsumerMaxDeliver(ctx, t, js, jb, queue, "berth", n)
}

// setConsumerMaxDeliver sets the MaxDeliver of the durable consumer named
// consumer on queue's stream.
func setConsumerMaxDeliver(ctx context.Context, t *testing.T, js jetstream.JetStream, jb *bjs.Broker, queue, consumer string, n int) {
	t.Helper()
	name, _ := jb.StreamNames(queue)
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Consumer(ctx, consumer)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	cc.MaxDeliver = n
	if _, err := js.UpdateConsumer(ctx, name, cc); err != nil {
		t.Fatal(err)
	}
}

// TestJetStreamPerSubjectLimit: every ready job of a queue is stored on one
// subject, so a MaxMsgsPerSubject on the queue's stream (which its discard
// policy does not govern without discard new per subject) keeps only the
// newest jobs and drops the others without an error to anyone. Doctor
// reported "no limit drops jobs" (OK): it read MaxAge, MaxMsgs and MaxBytes
// only.
func TestJetStreamPerSubjectLimit(t *testing.T) {
	b, jb, js := openJS(t, "persubject")
	ctx := testCtx(t)
	if err := jb.DeclareQueue(ctx, "persubject"); err != nil {
		t.Fatal(err)
	}
	name, _ := jb.StreamNames("persubject")
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgsPerSubject = 2
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The limit really drops jobs on the server: 5 published, 2 kept.
	for i := range 5 {
		if err := b.Publish(ctx, "persubject", &sdk.Message{ID: fmt.Sprintf("job-%d", i), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d jobs of 5 published, want 2 (the per-subject limit)", info.State.Msgs)
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"persubject"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.stream-limits", "persubject", doctor.Error)

	// Discard new per subject refuses the publish instead: a warning.
	cfg.Discard, cfg.DiscardNewPerSubject = jetstream.DiscardNew, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if fs, err = doctor.Run(ctx, b, doctor.Options{Queues: []string{"persubject"}}); err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.stream-limits", "persubject", doctor.Warn)
}

// TestJetStreamDelayConsumer: delayed publishes and retries wait on the
// queue's delayed subject, read by berth's second durable consumer
// ("berth-delay"), which naks each message until it is due; the nak counts
// a delivery. A server MaxDeliver on that consumer strands the job in the
// work-queue stream when it runs out, never moved to the ready subject; a
// missing one moves nothing. Doctor read only the "berth" consumer and
// reported both OK.
func TestJetStreamDelayConsumer(t *testing.T) {
	b, jb, js := openJS(t, "delaycap", "delaygone")
	ctx := testCtx(t)
	for _, q := range []string{"delaycap", "delaygone"} {
		if err := jb.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	setConsumerMaxDeliver(ctx, t, js, jb, "delaycap", "berth-delay", 1)
	name, _ := jb.StreamNames("delaygone")
	if err := js.DeleteConsumer(ctx, name, "berth-delay"); err != nil {
		t.Fatal(err)
	}

	// On the server: a job delayed 300 ms is never received, and stays.
	if err := b.Publish(ctx, "delaycap", &sdk.Message{ID: "late", Body: []byte("{}"), Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for rctx.Err() == nil {
		ds, err := b.Receive(rctx, "delaycap", 1)
		if len(ds) > 0 {
			t.Fatalf("the delayed job was received (%s): MaxDeliver 1 did not strand it", ds[0].Message().ID)
		}
		if err != nil && rctx.Err() == nil {
			t.Fatal(err)
		}
	}
	name, _ = jb.StreamNames("delaycap")
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream %s: %v, err %v; want the stranded job", name, info, err)
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"delaycap", "delaygone"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.consumer", "delaycap", doctor.Error)
	expect(t, fs, "jetstream.consumer", "delaygone", doctor.Error)
}
