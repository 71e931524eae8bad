package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestLedgerVerbsNameAMissingLedger: "jobs -schema WRONG" and "job show"
// failed with PostgreSQL's bare "relation ... does not exist" (exit 1), and
// "berth ui -db ... -schema WRONG" served job pages that all failed after
// creating the schema WRONG for its pause table. A schema that does not
// exist is now a named thing not found (exit 3) for all three, and berth ui
// creates nothing; a schema that exists without the ledger table is exit 3
// for the job verbs, while berth ui serves its other pages and says why it
// has no job pages.
func TestLedgerVerbsNameAMissingLedger(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	_, schema, wrong, exists := schemaAndWrong(t) // schema holds no ledger table
	for _, args := range [][]string{{"jobs"}, {"job", "show", "job-1"}} {
		r := cliDB(t, "", false, append(args, "-db", dsn, "-schema", wrong)...)
		if r.code != exitNotFound || !strings.Contains(r.err, `schema "`+wrong+`" does not exist`) || exists(wrong) {
			t.Errorf("%v -schema %s: exit %d, want %d and the schema named (created: %v):\n%s%s", args, wrong, r.code, exitNotFound, exists(wrong), r.out, r.err)
		}
		r = cliDB(t, "", false, append(args, "-db", dsn, "-schema", schema)...)
		if r.code != exitNotFound || !strings.Contains(r.err, `no ledger table "`+schema+`"."ledger_jobs"`) {
			t.Errorf("%v -schema %s (no table): exit %d, want %d and the table named:\n%s%s", args, schema, r.code, exitNotFound, r.out, r.err)
		}
	}

	b, _ := deadLettered(t, 1)
	open := func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }
	var out, errOut strings.Builder
	// Bounded: before, berth ui served on the wrong schema until stopped.
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	code := run(uctx, []string{"ui", "-addr", "127.0.0.1:0", "-url", "mem://", "-db", dsn, "-schema", wrong},
		env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, open: open})
	if code != exitNotFound || !strings.Contains(errOut.String(), `schema "`+wrong+`" does not exist`) || exists(wrong) {
		t.Errorf("ui -schema %s: exit %d, want %d, the schema named and not created (created: %v):\n%s%s", wrong, code, exitNotFound, exists(wrong), out.String(), errOut.String())
	}

	addr, stderr := startUI(t, env{open: open}, "-addr", "127.0.0.1:0", "-url", "mem://", "-db", dsn, "-schema", schema)
	if code, page := httpGet(t, "http://"+addr+"/", ""); code != 200 {
		t.Errorf("ui on a schema without a ledger: / %d\n%s", code, page)
	}
	if !strings.Contains(stderr.String(), "serving without job pages") {
		t.Errorf("ui on a schema without a ledger said nothing of its job pages:\n%s", stderr.String())
	}
}
