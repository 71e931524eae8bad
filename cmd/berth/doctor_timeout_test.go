package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
)

// doctorEnds runs "berth doctor" with args on rawURL and fails the test if
// it has not returned after a few minutes (the defect: it never did).
func doctorEnds(t *testing.T, rawURL string, args ...string) result {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- cliOn(t, rawURL, append([]string{"doctor"}, args...)...) }()
	select {
	case r := <-done:
		return r
	case <-time.After(3 * time.Minute):
		t.Fatalf("berth doctor %s is still running on a server that does not answer", strings.Join(args, " "))
		return result{}
	}
}

// frozenSQS returns the URL of a fault proxy to the SQS emulator, frozen
// (connections accepted, nothing answered), and a queue that exists.
func frozenSQS(t *testing.T) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	endpoint := integration.SQSEndpoint(t)
	ob, err := brokerurl.Open(ctx, endpoint+"?region=us-east-1", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := ob.(*sqs.Broker)
	queue := fmt.Sprintf("berth_cli_hung_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue, true)
		_ = b.Close()
	})
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	u, proxy := integration.ProxyURL(t, endpoint)
	u.RawQuery = "region=us-east-1"
	// Through the proxy the queue is checked as usual.
	if r := doctorEnds(t, u.String(), queue); !strings.Contains(r.out, "ok     sqs.redrive-policy  "+queue) {
		t.Fatalf("doctor through the proxy (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	proxy.Freeze()
	return u.String(), queue
}

// TestDoctorEndsOnASilentServer: "berth doctor" on an SQS endpoint that
// accepts connections and never answers ran for ever (the AWS SDK's HTTP
// client has no response timeout, and doctor set no deadline). Each check
// now has -check-timeout (default 10s) to answer: the queue is reported as
// not answering, with the call that hung, and the Redis check still runs.
func TestDoctorEndsOnASilentServer(t *testing.T) {
	u, queue := frozenSQS(t)

	r := doctorEnds(t, u, queue) // berth's defaults only
	if r.code != exitError || !strings.Contains(r.out, "error  doctor.check-timeout  "+queue+": the SQS checks of the queue did not answer within 10s: not checked") ||
		!strings.Contains(r.out, fmt.Sprintf("evidence: doctor: sqs: resolve %q", queue)) {
		t.Fatalf("doctor on a silent SQS (exit %d):\n%s%s", r.code, r.out, r.err)
	}

	r = doctorEnds(t, u, queue, "other_queue", "-check-timeout", "1s", "-redis", integration.RedisAddr(t), "-json")
	for _, want := range []string{
		`{"id":"doctor.check-timeout","severity":"error","queue":"` + queue + `","summary":"the SQS checks of the queue did not answer within 1s: not checked"`,
		`{"id":"doctor.check-timeout","severity":"error","queue":"other_queue",`,
		`"id":"idempotency.dedupe-ttl"`, // the next check ran
	} {
		if r.code != exitError || !strings.Contains(r.out, want) {
			t.Fatalf("doctor -check-timeout 1s (exit %d): no %s in\n%s%s", r.code, want, r.out, r.err)
		}
	}
	if r := cliOn(t, u, "doctor", queue, "-check-timeout", "0"); r.code != exitUsage {
		t.Errorf("-check-timeout 0: exit %d, %s", r.code, r.err)
	}
}

// TestDoctorDefaultDeadline: without -timeout, doctor's whole run has a
// deadline (1m; shortened here): checks that would wait longer
// (-check-timeout 10m) are reported as not finished before it.
func TestDoctorDefaultDeadline(t *testing.T) {
	u, queue := frozenSQS(t)
	defer func(d time.Duration) { doctorTimeout = d }(doctorTimeout)
	doctorTimeout = 2 * time.Second
	r := doctorEnds(t, u, queue, "other_queue", "-check-timeout", "10m")
	for _, q := range []string{queue, "other_queue"} {
		if want := "error  doctor.check-timeout  " + q + ": the SQS checks of the queue did not finish before doctor's overall deadline: not checked"; r.code != exitError || !strings.Contains(r.out, want) {
			t.Fatalf("doctor without -timeout (exit %d): no %q in\n%s%s", r.code, want, r.out, r.err)
		}
	}
	if !strings.Contains(r.out, "worker.drain-over-grace-period") {
		t.Errorf("the Worker's checks did not run:\n%s", r.out)
	}
}

// TestDoctorSilentRedis: a Redis that stops answering made "berth doctor
// -redis" fail with "doctor: redis: i/o timeout" and print no finding at
// all; it is now one finding among the others. The client's read timeout
// (go-redis's default, 5s) ends the call before -check-timeout (10s): the
// finding names that timeout, not the check's.
func TestDoctorSilentRedis(t *testing.T) {
	b, _ := deadLettered(t, 1)
	proxy := integration.StartProxy(t, integration.RedisAddr(t))
	proxy.Freeze()
	done := make(chan result, 1)
	go func() { done <- berth(t, b, "doctor", "-redis", proxy.Addr()) }()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("berth doctor -redis is still running on a Redis that does not answer")
	}
	if r.code != exitError || !strings.Contains(r.out, "error  doctor.check-timeout  berth:idem:*: the Redis dedupe cache checks did not answer within the Redis client's read timeout (5s)") ||
		!strings.Contains(r.out, "i/o timeout") || !strings.Contains(r.out, "info   broker.checks") {
		t.Fatalf("doctor -redis on a silent Redis (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}

// TestDoctorSilentDB: a -db that accepts connections and never answers
// made "berth doctor" wait 30 s for the connection and then fail with
// "database: … timeout", printing no finding at all: the broker's checks
// did not run. Like a silent Redis (TestDoctorSilentRedis), it is now one
// doctor.check-timeout finding, within -check-timeout, among the others.
func TestDoctorSilentDB(t *testing.T) {
	b, _ := deadLettered(t, 1)
	u, proxy := integration.ProxyURL(t, integration.PostgresDSN(t))
	proxy.Freeze()
	done := make(chan result, 1)
	go func() { done <- berth(t, b, "doctor", "-db", u.String(), "-check-timeout", "1s", "-json") }()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("berth doctor -db is still running on a database that does not answer")
	}
	for _, want := range []string{
		`{"id":"doctor.check-timeout","severity":"error","queue":"-db","summary":"the database of -db did not answer within 1s: its ledger and idempotency checks were not run"`,
		`"id":"broker.checks"`, // the other checks ran
	} {
		if r.code != exitError || !strings.Contains(r.out, want) {
			t.Fatalf("doctor -db on a silent database (exit %d): no %s in\n%s%s", r.code, want, r.out, r.err)
		}
	}
}
