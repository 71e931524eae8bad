package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/sdk"
)

// TestJetStreamMaxAgeWithDiscardNew: a stream's MaxAge removes every
// message older than it whatever its discard policy (discard new only
// refuses publishes past MaxMsgs, MaxBytes or MaxMsgsPerSubject), so a
// job that waits longer in the queue is deleted without running and
// without an error to anyone. Doctor graded a MaxAge with discard new a
// warning, "publishes refused", and berth doctor exited 0.
func TestJetStreamMaxAgeWithDiscardNew(t *testing.T) {
	b, jb, js := openJS(t, "aged")
	ctx := testCtx(t)
	if err := jb.DeclareQueue(ctx, "aged"); err != nil {
		t.Fatal(err)
	}
	name, _ := jb.StreamNames("aged")
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxAge, cfg.Discard = time.Second, jetstream.DiscardNew
	cfg.Duplicates = min(cfg.Duplicates, cfg.MaxAge)
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// On the server: the job published is removed unreceived.
	if err := b.Publish(ctx, "aged", &sdk.Message{ID: "waits", Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		info, err := st.Info(wctx)
		if err != nil {
			t.Fatalf("the stream kept the job past its MaxAge (%v)", err)
		}
		if info.State.Msgs == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"aged"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "jetstream.stream-limits", "aged", doctor.Error)
}
