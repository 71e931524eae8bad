package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestJobsOnPostgresBroker: on the PostgreSQL broker the job verbs read its
// jobs table through -url, nothing else configured.
func TestJobsOnPostgresBroker(t *testing.T) {
	ctx := context.Background()
	_, b, u := pgSchema(t, false)
	failing := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:o1", Body: []byte(`{}`)}
	done := &sdk.Message{Type: "billing.charge", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "billing", failing, done); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Receive = %d, %v", len(ds), err)
	}
	for _, d := range ds {
		if d.Message().ID == failing.ID {
			err = d.Retry(ctx, time.Hour, errors.New("card service timeout \x1b[31m"))
		} else {
			err = d.Ack(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	r := cliOn(t, u, "job", "show", "charge:o1")
	if r.code != exitOK || !strings.Contains(r.out, "status:          retrying") || !strings.Contains(r.out, "card service timeout") ||
		!strings.Contains(r.out, "next attempt:") || strings.Contains(r.out, "\x1b") {
		t.Errorf("job show by key: exit %d\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "jobs", "-queue", "billing", "-status", "retrying", "-since", "1h", "-json")
	var v jsonJobs
	if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK {
		t.Fatalf("jobs -json: exit %d, %v\n%s%s", r.code, err, r.out, r.err)
	}
	if len(v.Jobs) != 1 || v.Jobs[0].ID != failing.ID || v.Total == nil || *v.Total != 1 || v.Next != nil {
		t.Errorf("jobs -status retrying = %+v", v)
	}
	r = cliOn(t, u, "jobs", "-queue", "billing", "-limit", "1")
	if r.code != exitOK || !strings.Contains(r.out, "1 job(s) shown of 2 matching") || !strings.Contains(r.out, "next page: -after ") {
		t.Errorf("jobs -limit 1: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "job", "show", "no-such-job"); r.code != exitNotFound {
		t.Errorf("job show of an unknown job: exit %d, want %d\n%s", r.code, exitNotFound, r.err)
	}
	if r := cliOn(t, u, "jobs", "-queue", "billing", "-status", "dead"); r.code != exitNotFound {
		t.Errorf("jobs matching nothing: exit %d, want %d", r.code, exitNotFound)
	}
	if r := cliOn(t, u, "jobs", "-status", "exploded"); r.code != exitUsage {
		t.Errorf("jobs -status exploded: exit %d, want %d", r.code, exitUsage)
	}
}

// TestJobsOnLedger: with -db the job verbs read the ledger's own tables
// (fed on RabbitMQ, SQS or memory), with every attempt.
func TestJobsOnLedger(t *testing.T) {
	ctx := context.Background()
	dsn, schema, s := migratedLedger(t, "cli_ledger_")
	t0 := time.Now().Add(-time.Minute)
	ev := func(st ledger.Status, attempt, sec int, worker, e string) ledger.Event {
		at := t0.Add(time.Duration(sec) * time.Second)
		return ledger.Event{MessageID: "m1", Queue: "emails", Type: "email.send", IdempotencyKey: "welcome:u7", Status: st,
			Attempt: attempt, At: at, StartedAt: at, Worker: worker, Error: e, Class: sdk.ClassTransient}
	}
	if err := s.Write(ctx, []ledger.Event{ev(ledger.StatusEnqueued, 0, 0, "", ""), ev(ledger.StatusRunning, 1, 1, "host-a/41", "")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, []ledger.Event{ev(ledger.StatusRunning, 2, 5, "host-b/7", ""), ev(ledger.StatusSucceeded, 2, 6, "host-b/7", "")}); err != nil {
		t.Fatal(err)
	}
	m, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	onLedger := func(args ...string) result {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"-db", dsn, "-schema", schema}, args...), env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut,
			getenv: func(string) string { return "" }, open: func(context.Context, string) (sdk.Broker, error) { return m, nil }})
		return result{out.String(), errOut.String(), code}
	}
	r := onLedger("job", "show", "welcome:u7")
	if r.code != exitOK || !strings.Contains(r.out, "status:          succeeded") ||
		!strings.Contains(r.out, "running (abandoned: never settled)") || !strings.Contains(r.out, "host-a/41") {
		t.Errorf("job show: exit %d\n%s%s", r.code, r.out, r.err)
	}
	r = onLedger("job", "show", "m1", "-json")
	var j jsonJob
	if err := json.Unmarshal([]byte(r.out), &j); err != nil || len(j.History) != 2 || !j.History[0].Abandoned || j.Attempts != 2 {
		t.Errorf("job show -json: %+v, %v\n%s", j, err, r.err)
	}
	r = onLedger("jobs", "-queue", "emails", "-status", "succeeded,dead", "-since", "1h")
	if r.code != exitOK || !strings.Contains(r.out, "1 job(s) shown of 1 matching") {
		t.Errorf("jobs: exit %d\n%s%s", r.code, r.out, r.err)
	}
	// A broker without job state, and no -db: a usage error naming -db.
	r = berth(t, m, "jobs")
	if r.code != exitUsage || !strings.Contains(r.err, "-db") {
		t.Errorf("jobs on memory without -db: exit %d, %s", r.code, r.err)
	}
}
