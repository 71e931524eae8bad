package doctor_test

import (
	"context"
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
	name, _ := jb.StreamNames(queue)
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Consumer(ctx, "berth")
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	cc.MaxDeliver = n
	if _, err := js.UpdateConsumer(ctx, name, cc); err != nil {
		t.Fatal(err)
	}
}
