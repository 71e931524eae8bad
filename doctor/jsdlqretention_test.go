package doctor_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/doctor"
)

// TestJetStreamDeadLetterStreamInterest: a dead-letter stream made by hand
// (or by infrastructure as code) with interest retention keeps a message
// only while a consumer has yet to ack it: with none, which is the rule on
// a dead-letter stream nobody reads until a bad day, every dead letter is
// dropped as it is stored. Doctor checked only the stream's limits and
// reported "dead letters are kept until handled".
func TestJetStreamDeadLetterStreamInterest(t *testing.T) {
	b, jb, js := openJS(t, "interest")
	ctx := testCtx(t)
	if err := jb.DeclareQueue(ctx, "interest"); err != nil {
		t.Fatal(err)
	}
	_, dlq := jb.StreamNames("interest")
	st, err := js.Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if err := js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	cfg.Retention = jetstream.InterestPolicy
	if st, err = js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// On the server: a dead letter stored there is gone at once.
	subject := cfg.Subjects[0][:len(cfg.Subjects[0])-1] + "x"
	if _, err := js.Publish(ctx, subject, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("the interest stream kept %d messages without a consumer", info.State.Msgs)
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"interest"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.dead-letter-stream", "interest", doctor.Error)
}
