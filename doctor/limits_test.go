package doctor_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// withDLQ declares name as a quorum queue with a dead-letter exchange and
// the extra arguments, and its dead-letter queue, so that only those
// arguments are wrong.
func withDLQ(t *testing.T, conn *amqp.Connection, name string, extra amqp.Table) {
	t.Helper()
	args := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": rabbitmq.DefaultDeadLetterExchange,
		"x-dead-letter-routing-key": name, "x-delivery-limit": int64(9)}
	for k, v := range extra {
		args[k] = v
	}
	declare(t, conn, name, args)
	declare(t, conn, rabbitmq.DeadLetterQueue(name), amqp.Table{"x-queue-type": "quorum"})
}

// TestRabbitMQQueueLimits: a job queue declared by someone else with a
// message TTL, a queue expiry or a length limit that drops the oldest jobs
// loses jobs that never ran. Doctor did not look at those arguments: every
// one of these queues passed.
func TestRabbitMQQueueLimits(t *testing.T) {
	url := integration.RabbitMQURL(t)
	ttl, expires, dropHead, dropBytes, rejecting := "ttl", "expires", "drophead", "dropbytes", "rejecting"
	conn := rawRabbit(t, url, &ttl, &expires, &dropHead, &dropBytes, &rejecting)
	withDLQ(t, conn, ttl, amqp.Table{"x-message-ttl": int64(60000)})
	withDLQ(t, conn, expires, amqp.Table{"x-expires": int64(3600000)})
	withDLQ(t, conn, dropHead, amqp.Table{"x-max-length": int64(1)})
	withDLQ(t, conn, dropBytes, amqp.Table{"x-max-length-bytes": int64(1 << 20), "x-overflow": "drop-head"})
	withDLQ(t, conn, rejecting, amqp.Table{"x-max-length": int64(1000), "x-overflow": "reject-publish"})

	// On the server, the full drop-head queue drops its oldest job.
	ctx := testCtx(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, body := range []string{`{"n":1}`, `{"n":2}`} {
		if err := ch.PublishWithContext(ctx, "", dropHead, true, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		st, err := ch.QueueDeclarePassive(dropHead, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Messages == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s holds %d messages", dropHead, st.Messages)
		case <-time.After(50 * time.Millisecond):
		}
	}

	b := open(t, url)
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{ttl, expires, dropHead, dropBytes, rejecting}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.queue-limits", ttl, doctor.Error)
	expect(t, fs, "rabbitmq.queue-limits", expires, doctor.Warn)
	expect(t, fs, "rabbitmq.queue-limits", dropHead, doctor.Error)
	expect(t, fs, "rabbitmq.queue-limits", dropBytes, doctor.Error)
	expect(t, fs, "rabbitmq.queue-limits", rejecting, doctor.Warn)
	for q, want := range map[string]string{ttl: "x-message-ttl=60000", expires: "x-expires=3600000",
		dropHead: "x-max-length=1 (no x-overflow: drop-head)", dropBytes: "x-max-length-bytes=1048576 x-overflow=drop-head",
		rejecting: "x-max-length=1000 x-overflow=reject-publish"} {
		for _, f := range find(fs, "rabbitmq.queue-limits", q) {
			if f.Evidence != want {
				t.Errorf("%s: evidence %q, want %q", q, f.Evidence, want)
			}
		}
	}
	// The other checks of those queues still pass: only the limits are wrong.
	for _, q := range []string{ttl, expires, dropHead, dropBytes, rejecting} {
		expect(t, fs, "rabbitmq.delivery-limit", q, doctor.OK)
		expect(t, fs, "rabbitmq.dead-letter-exchange", q, doctor.OK)
	}
}

// TestRabbitMQDeliveryLimitBelowMaxAttempts: a quorum queue whose
// x-delivery-limit lets fewer deliveries than the Workers' MaxAttempts has
// the server dead-letter a job returned unsettled that often (berth counts
// those deliveries as attempts) before its retry policy ends. Doctor
// reported any limit OK. The server's version is read from its connection
// properties and shown.
func TestRabbitMQDeliveryLimitBelowMaxAttempts(t *testing.T) {
	url := integration.RabbitMQURL(t)
	low := "lowlimit"
	conn := rawRabbit(t, url, &low)
	declare(t, conn, low, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": rabbitmq.DefaultDeadLetterExchange,
		"x-dead-letter-routing-key": low, "x-delivery-limit": int64(2)})
	declare(t, conn, rabbitmq.DeadLetterQueue(low), amqp.Table{"x-queue-type": "quorum"})
	b := open(t, url)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{low}, MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.delivery-limit", low, doctor.Warn)
	for _, f := range find(fs, "rabbitmq.delivery-limit", low) {
		if !strings.Contains(f.Summary, "after 3 deliveries") || !strings.Contains(f.Evidence, "x-delivery-limit 2") ||
			!strings.Contains(f.Evidence, "RabbitMQ ") || strings.Contains(f.Evidence, "not announced") {
			t.Errorf("delivery limit: %+v", f)
		}
	}
	fs, err = doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{low}, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.delivery-limit", low, doctor.OK)
}

// TestRabbitMQCheckTimeout: a RabbitMQ that stops answering after the
// broker connected (its replies held by a proxy: a half-open connection)
// must not hang doctor. amqp091's channel calls take no context, so each
// queue's checks are left behind at Options.CheckTimeout: each queue is
// reported as not answering, and the Redis check still runs.
func TestRabbitMQCheckTimeout(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q1, q2 := "hung1", "hung2"
	rawRabbit(t, url, &q1, &q2)
	u, proxy := integration.ProxyURL(t, url)
	b := open(t, u.String())
	for _, q := range []string{q1, q2} {
		if err := b.(sdk.QueueDeclarer).DeclareQueue(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t)})
	defer rdb.Close()
	proxy.Freeze()
	t.Cleanup(proxy.Thaw) // before the broker closes (cleanups run last first)

	type result struct {
		fs  []doctor.Finding
		err error
	}
	done := make(chan result, 1)
	go func() {
		fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q1, q2}, CheckTimeout: time.Second, Redis: rdb,
			RedisPrefix: "berth_doctor_none_" + suffix() + ":"})
		done <- result{fs, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("doctor.Run on a RabbitMQ that does not answer is still running")
	}
	if r.err != nil {
		t.Fatalf("Run: %v (findings %s)", r.err, ids(r.fs))
	}
	for _, q := range []string{q1, q2} {
		expect(t, r.fs, "doctor.check-timeout", q, doctor.Error)
		for _, f := range find(r.fs, "doctor.check-timeout", q) {
			if !strings.Contains(f.Summary, "RabbitMQ checks of the queue did not answer within 1s") {
				t.Errorf("%s: %+v", q, f)
			}
		}
		if got := find(r.fs, "rabbitmq.queue-type", q); len(got) != 0 {
			t.Errorf("%s: checked although it did not answer: %+v", q, got)
		}
	}
	expect(t, r.fs, "idempotency.dedupe-ttl", "", doctor.Info) // the next check ran
	if doctor.Worst(r.fs) != doctor.Error || r.fs[0].Severity != doctor.Error {
		t.Errorf("findings not sorted worst first: %s", ids(r.fs))
	}
}
