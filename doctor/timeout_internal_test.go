package doctor

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hungRabbit answers like argsRabbit, except that QueueArguments of the
// queues in hang waits, whatever its context, until release is closed: a
// RabbitMQ that stopped answering, called through amqp091, whose channel
// calls take no context. calls counts the QueueArguments calls made.
type hungRabbit struct {
	argsRabbit
	hang    map[string]bool
	release chan struct{}
	calls   atomic.Int32
}

func (f *hungRabbit) QueueArguments(ctx context.Context, q string) (map[string]any, error) {
	f.calls.Add(1)
	if f.hang[q] {
		<-f.release
	}
	return f.argsRabbit.QueueArguments(ctx, q)
}

func newHungRabbit(t *testing.T, hang ...string) *hungRabbit {
	f := &hungRabbit{argsRabbit: argsRabbit{args: map[string]map[string]any{}, version: "3.13.7"},
		hang: map[string]bool{}, release: make(chan struct{})}
	for _, q := range hang {
		f.hang[q] = true
	}
	t.Cleanup(func() { close(f.release) }) // the calls left behind end
	return f
}

// TestNoCheckStartsAfterTheRunsDeadline: once ctx's deadline (berth
// doctor's -timeout) has passed, a check is not started. Each one was: on a
// RabbitMQ that does not answer, each queue's check opened one more call
// on the broker's connection, left waiting, and held the run for the
// answer grace, so "-timeout 3s" on 20 queues ran for 23 s and more.
func TestNoCheckStartsAfterTheRunsDeadline(t *testing.T) {
	b := newHungRabbit(t, "q1", "q2", "q3")
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	fs, err := rabbitMQ(ctx, b, Options{Queues: []string{"q1", "q2", "q3"}, CheckTimeout: time.Hour}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if n := b.calls.Load(); n != 0 {
		t.Errorf("%d calls made after the run's deadline", n)
	}
	for _, q := range []string{"q1", "q2", "q3"} {
		got := 0
		for _, f := range fs {
			if f.Queue != q {
				continue
			}
			got++
			if f.ID != "doctor.check-timeout" || f.Severity != Error || !strings.Contains(f.Summary, "overall deadline") ||
				!strings.Contains(f.Evidence, "not started") {
				t.Errorf("%s: %+v", q, f)
			}
		}
		if got != 1 {
			t.Errorf("%s: %d findings, want the one doctor.check-timeout", q, got)
		}
	}
}

// TestRabbitMQTimeoutNamesTheCall: a RabbitMQ check left waiting on a call
// (amqp091's take no context, so the call cannot return its own error)
// names the call it waited for, as README.md promises ("the call that did
// not answer"): here the dead-letter queue's arguments. The evidence said
// only that a call was left waiting.
func TestRabbitMQTimeoutNamesTheCall(t *testing.T) {
	b := newHungRabbit(t, "q1.dlq")
	b.args["q1"] = map[string]any{"x-queue-type": "quorum", "x-delivery-limit": int64(9), "x-dead-letter-exchange": "berth.dlx"}
	b.args["q2"] = b.args["q1"]
	b.args["q2.dlq"] = map[string]any{"x-queue-type": "quorum"}
	fs, err := rabbitMQ(context.Background(), b, Options{Queues: []string{"q1", "q2"}, CheckTimeout: 500 * time.Millisecond}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var timedOut []Finding
	for _, f := range fs {
		if f.ID == "doctor.check-timeout" {
			timedOut = append(timedOut, f)
		}
	}
	if len(timedOut) != 1 || timedOut[0].Queue != "q1" || !strings.Contains(timedOut[0].Evidence, `the arguments of queue "q1.dlq" (queue.declare)`) {
		t.Errorf("timeouts %+v", timedOut)
	}
	dlq := false // q2, checked after q1 was left behind, was checked in full
	for _, f := range fs {
		dlq = dlq || f.ID == "rabbitmq.dead-letter-queue" && f.Queue == "q2" && f.Severity == OK
	}
	if !dlq {
		t.Errorf("q2 not checked: %+v", fs)
	}
}

// silentVersionRabbit answers like argsRabbit, except that reading the
// server's version gets no answer until the check's deadline.
type silentVersionRabbit struct{ argsRabbit }

func (silentVersionRabbit) ServerVersion(ctx context.Context) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// TestRabbitMQVersionTimeoutSaysSo: when reading the server's version
// times out, the delivery-limit evidence said the server had not announced
// its version — a claim about the server doctor never got to check. It
// says the version could not be read, and why.
func TestRabbitMQVersionTimeoutSaysSo(t *testing.T) {
	b := silentVersionRabbit{argsRabbit{args: map[string]map[string]any{
		"q1":     {"x-queue-type": "quorum", "x-dead-letter-exchange": "berth.dlx"},
		"q1.dlq": {"x-queue-type": "quorum"},
	}}}
	fs, err := rabbitMQ(context.Background(), b, Options{Queues: []string{"q1"}, CheckTimeout: 50 * time.Millisecond}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var dl []Finding
	for _, f := range fs {
		if f.ID == "rabbitmq.delivery-limit" {
			dl = append(dl, f)
		}
	}
	if len(dl) != 1 {
		t.Fatalf("delivery-limit findings %+v, want one", dl)
	}
	ev := dl[0].Evidence
	if strings.Contains(ev, "not announced") || !strings.Contains(ev, "server version could not be read (timed out: ") ||
		!strings.Contains(ev, "deadline exceeded") || !strings.Contains(ev, "read as older than 4.0") {
		t.Errorf("evidence %q; want the version said unread (timed out), not unannounced", ev)
	}
}
