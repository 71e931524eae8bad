package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger/pgledger"
)

// "berth doctor -db … -schema X" with no ledger tables in X says so (a
// warning naming the schema), so a wrong -schema or -db does not look
// clean; with the ledger there, the finding is absent.
func TestDoctorLedgerMissing(t *testing.T) {
	b, _ := deadLettered(t, 1)
	dsn := integration.PostgresDSN(t)
	schema := fmt.Sprintf("cli_ledger_%d", rand.Uint64()%1e12)

	r := berth(t, b, "doctor", "billing", "-db", dsn, "-schema", schema)
	if r.code != exitOK || !strings.Contains(r.out, "warn   ledger.tables-missing  "+schema+".ledger_jobs: no ledger tables in -schema "+schema) ||
		!strings.Contains(r.out, "evidence: no table "+schema+".ledger_jobs") || !strings.Contains(r.out, "fix: ") {
		t.Fatalf("doctor -schema %s without a ledger (exit %d):\n%s%s", schema, r.code, r.out, r.err)
	}
	r = berth(t, b, "doctor", "billing", "-db", dsn, "-schema", schema, "-json")
	var doc struct {
		Findings []struct{ ID, Severity, Queue string }
		Warnings int
	}
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatalf("doctor -json: %v\n%s", err, r.out)
	}
	found := false
	for _, f := range doc.Findings {
		found = found || (f.ID == "ledger.tables-missing" && f.Severity == "warn" && f.Queue == schema+".ledger_jobs")
	}
	if !found || doc.Warnings == 0 {
		t.Fatalf("doctor -json lacks the warning ledger.tables-missing: %s", r.out)
	}
	// Worst first, the ledger's finding included: a warning after an ok
	// reads as if everything above it were fine.
	rank := map[string]int{"error": 0, "warn": 1, "info": 2, "ok": 3}
	for i := 1; i < len(doc.Findings); i++ {
		if rank[doc.Findings[i].Severity] < rank[doc.Findings[i-1].Severity] {
			t.Fatalf("findings not worst first: %s %s after %s %s", doc.Findings[i].Severity, doc.Findings[i].ID,
				doc.Findings[i-1].Severity, doc.Findings[i-1].ID)
		}
	}

	// With the ledger's tables in the schema: its checks run, no finding.
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r = berth(t, b, "doctor", "billing", "-db", dsn, "-schema", schema)
	if strings.Contains(r.out, "ledger.tables-missing") || !strings.Contains(r.out, "ledger.") {
		t.Fatalf("doctor with the ledger (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}
