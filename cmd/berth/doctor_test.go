package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestDoctorOnPostgres runs "berth doctor" through the real URL opener on a
// fresh job table (only the server's own autovacuum setting may be an error
// there), then on the table without its claim index: exit 1, the finding
// printed with its evidence and fix, no colour off a terminal.
func TestDoctorOnPostgres(t *testing.T) {
	ctx := context.Background()
	pool, b, u := pgSchema(t, false)
	if err := b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	r := cliOn(t, u, "doctor", "-json")
	var doc jsonDoctor
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatalf("doctor -json (exit %d): %v\n%s%s", r.code, err, r.out, r.err)
	}
	for _, f := range doc.Findings {
		if f.Severity == doctor.Error && f.ID != "postgres.autovacuum-server" {
			t.Errorf("error on a fresh table: %+v", f)
		}
	}
	if want := map[bool]int{true: exitError, false: exitOK}[doc.Errors > 0]; r.code != want {
		t.Errorf("exit %d with %d errors, want %d", r.code, doc.Errors, want)
	}
	if doc.Worst == "" || len(doc.Findings) < 8 {
		t.Errorf("doctor -json: %+v", doc)
	}

	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{b.Schema(), "jobs_claim_idx"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	r = cliOn(t, u, "doctor", "-max-attempts", "3")
	if r.code != exitError || !strings.Contains(r.out, "error  postgres.indexes  "+b.Schema()+".jobs: ") ||
		!strings.Contains(r.out, "evidence: jobs_claim_idx missing (every claim scans the whole table)") || !strings.Contains(r.out, "fix: ") {
		t.Fatalf("doctor without the claim index (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if strings.Contains(r.out, "\x1b") {
		t.Errorf("colour escapes off a terminal:\n%q", r.out)
	}

	// -db: the idempotency results in the same database, a claim stuck in it.
	store, err := pgstore.New(pool, pgstore.Options{Schema: b.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{b.Schema(), "job_results"}.Sanitize()+` (idempotency_key, status, owner_token, locked_until, expires_at)
		VALUES ('charge:order_lost:v1', 'in_progress', 'w1', now() - interval '1 hour', now() + interval '7 days')`); err != nil {
		t.Fatal(err)
	}
	r = cliOn(t, u, "doctor", "-db", integration.PostgresDSN(t), "-schema", b.Schema(), "-results-table", b.Schema()+".job_results",
		"-redis", integration.RedisAddr(t))
	if !strings.Contains(r.out, "warn   idempotency.claims-stuck  "+b.Schema()+".job_results: ") || !strings.Contains(r.out, "idempotency.dedupe-ttl") {
		t.Fatalf("doctor -db -redis (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}

// TestDoctorText: colour only when stdout is a terminal; untrusted text
// escaped either way.
func TestDoctorText(t *testing.T) {
	fs := []doctor.Finding{
		{ID: "x.bad", Severity: doctor.Error, Queue: "q\x1b[2J", Summary: "s", Evidence: "arg=\x1b]0;pwned\x07", Fix: "f"},
		{ID: "x.good", Severity: doctor.OK, Summary: "fine"},
	}
	for _, colour := range []bool{false, true} {
		var out bytes.Buffer
		c := &cli{env: env{stdout: &out, colour: colour}}
		c.printFindings(fs, 1, 0)
		s := out.String()
		if strings.Contains(s, "\x1b[2J") || strings.Contains(s, "\x1b]0") || strings.Contains(s, "\x07") {
			t.Errorf("colour %v: untrusted escape reached the terminal: %q", colour, s)
		}
		if got := strings.Contains(s, "\x1b[1;31merror\x1b[0m"); got != colour {
			t.Errorf("colour %v: red severity %v in %q", colour, got, s)
		}
		if !strings.Contains(s, "2 checks: 1 errors, 0 warnings") {
			t.Errorf("no summary line: %q", s)
		}
	}
}

// TestDoctorOnMemory: a broker without its own checks still has the
// Worker's options checked against its cap: exit 0 with a warning.
func TestDoctorOnMemory(t *testing.T) {
	b, err := memory.New(memory.Options{MaxDeliveries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := berth(t, b, "doctor")
	if r.code != exitOK || !strings.Contains(r.out, "warn   worker.max-attempts-over-broker-cap: ") || !strings.Contains(r.out, "info   broker.checks") {
		t.Fatalf("doctor on memory (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}

// TestLedgerMissingSeverity: with the default schema (-db may name the
// application's database for the idempotency checks alone) the missing
// ledger is info; with -schema given it is a warning.
func TestLedgerMissingSeverity(t *testing.T) {
	if f := ledgerMissingFinding("berth", false, false); f.Severity != doctor.Info || f.Queue != "berth.ledger_jobs" {
		t.Errorf("default schema: %+v", f)
	}
	if f := ledgerMissingFinding("app", true, false); f.Severity != doctor.Warn || !strings.Contains(f.Summary, "-schema app") {
		t.Errorf("-schema app: %+v", f)
	}
	// On the PostgreSQL broker the ledger checks run all the same, on its
	// jobs table: the finding must not say they did not.
	for _, explicit := range []bool{false, true} {
		f := ledgerMissingFinding("app", explicit, true)
		if strings.Contains(f.Summary, "not run") || !strings.Contains(f.Summary, "jobs table") {
			t.Errorf("PostgreSQL broker, -schema given %v: %+v", explicit, f)
		}
	}
}
