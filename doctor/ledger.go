package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthq/berth/internal/pgindex"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// Ledger runs the checks that read job history (package ledger: the
// ledger's tables, or the PostgreSQL broker's jobs table), over the last
// Options.LedgerWindow:
//
//   - ledger.duration: the p99 handler run time against the longest job
//     allowed (Options.LongestJob, the Workers' Timeout) and the lease;
//   - ledger.same-error-exhausted: several jobs dead-lettered as transient
//     with the same error after retries: a permanent error classified as
//     transient, retried to exhaustion;
//   - ledger.retry-storm: more jobs retrying than succeeding;
//   - ledger.dlq-growth: more dead letters in the last window than twice the
//     one before;
//   - ledger.indexes, on the ledger's own tables (pgledger.Store): the
//     indexes pgledger.SQL creates are present, valid and defined as it
//     has them (a table made by an earlier release lacks those added since
//     until Migrate runs, and keeps an index of the same name with other
//     columns, which Migrate does not replace, and skips a name another
//     relation of the schema holds: the fix renames it; a replacement
//     Index.Replace left under the name with "_new" is taken up where
//     it stopped, and a valid "_new" made otherwise is renamed before
//     Replace, which would drop it; a replacement left beside a right
//     index, the same index again or invalid, is dropped). Indexes that
//     are all being built by
//     a CREATE INDEX CONCURRENTLY under way (or may be, by another role's
//     build whose index doctor's user cannot see: no DROP), or cannot be
//     read, are an Info ledger.indexes finding (a doctor.check-timeout
//     one when they did not answer in time); the other findings stand.
//     Where only pg_stat_progress_create_index cannot be read, an invalid
//     index may be a build under way: the evidence says so and the fix
//     warns before its DROP.
//
// lease is the broker's lease (0: none; negative: not known, as when
// [RunStores] runs without a broker).
func Ledger(ctx context.Context, r ledger.Reader, lease time.Duration, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	now := o.Now()
	since := now.Add(-o.LedgerWindow)
	var fs []Finding

	// Durations.
	page, err := r.List(ctx, ledger.Filter{Statuses: []ledger.Status{ledger.StatusSucceeded, ledger.StatusDead, ledger.StatusRetrying},
		Since: since, Limit: ledger.MaxLimit})
	if err != nil {
		return nil, fmt.Errorf("doctor: ledger: %w", err)
	}
	var ds []time.Duration
	for _, j := range page.Jobs {
		if j.Duration > 0 {
			ds = append(ds, j.Duration)
		}
	}
	// One page is read: with more jobs than it holds, the counts are of
	// the page's, the newest (first seen).
	finished, sample := strconv.Itoa(len(page.Jobs)), ""
	if page.Next != "" {
		finished = "more than " + finished
		sample = fmt.Sprintf(", among the newest %d of more jobs", len(page.Jobs))
	}
	leaseText := fmt.Sprintf("lease %s, extended by the heartbeat", lease)
	switch {
	case lease < 0:
		leaseText = "the broker's lease not read (no broker)"
	case lease == 0:
		leaseText = "no broker lease" // RabbitMQ: consumer_timeout, not a lease, bounds a delivery
	}
	if len(ds) == 0 {
		fs = append(fs, Finding{ID: "ledger.duration", Severity: Info, Summary: "no handler run time recorded in the window: not checkable",
			Evidence: fmt.Sprintf("%s jobs finished since %s, none with a duration (the PostgreSQL broker's table keeps none: use the ledger)", finished, since.UTC().Format(time.RFC3339)),
			Fix:      "record job state with package ledger (a Worker Observer) to check durations"})
	} else {
		slices.Sort(ds)
		p99 := ds[(len(ds)*99+99)/100-1]
		ev := fmt.Sprintf("p99 %s of %d runs%s (max %s); longest job allowed %s; %s", p99.Round(time.Millisecond), len(ds), sample,
			ds[len(ds)-1].Round(time.Millisecond), o.LongestJob, leaseText)
		if o.LongestJob > 0 && p99*10 >= o.LongestJob*8 {
			fs = append(fs, Finding{ID: "ledger.duration", Severity: Warn, Summary: "jobs run close to their timeout (or RabbitMQ's consumer_timeout): the slow ones are cut and retried",
				Evidence: ev, Fix: "raise WorkerOptions.Timeout (TimeoutByType for the slow type) and, on RabbitMQ, consumer_timeout; or make the job faster or smaller"})
		} else {
			fs = append(fs, Finding{ID: "ledger.duration", Severity: OK, Summary: "handlers finish well within their timeout", Evidence: ev})
		}
	}

	// The same transient error retried to exhaustion.
	dead, err := r.List(ctx, ledger.Filter{Statuses: []ledger.Status{ledger.StatusDead}, Since: since, Limit: ledger.MaxLimit})
	if err != nil {
		return nil, fmt.Errorf("doctor: ledger: %w", err)
	}
	groups := map[string]int{}
	for _, j := range dead.Jobs {
		if j.Attempts < 2 || j.LastError == "" {
			continue
		}
		switch j.ErrorClass {
		case sdk.ClassPermanent, sdk.ClassPoison, sdk.ClassRetryAfter:
			continue
		}
		groups[j.LastError]++
	}
	worst, count := "", 0
	for e, n := range groups {
		if n > count || (n == count && e < worst) {
			worst, count = e, n
		}
	}
	if count >= o.SameError {
		fs = append(fs, Finding{ID: "ledger.same-error-exhausted", Severity: Warn, Summary: "the same error was retried to exhaustion on several jobs: probably a permanent error classified as transient",
			Evidence: fmt.Sprintf("%d jobs dead-lettered since %s after retries with the error \"%s\"", count, since.UTC().Format(time.RFC3339), sdk.SanitizeReason(worst)),
			Fix:      "return sdk.Permanent(err) for it in the handler (dead-lettered at once, no retries), or fix its cause; then redrive"})
	} else {
		fs = append(fs, Finding{ID: "ledger.same-error-exhausted", Severity: OK, Summary: "no error was retried to exhaustion on several jobs",
			Evidence: fmt.Sprintf("%d dead letters since %s; the most common retried error on %d", len(dead.Jobs), since.UTC().Format(time.RFC3339), count)})
	}

	// Retry storms and dead-letter growth.
	cur, err := r.Counts(ctx, ledger.Window{Since: since, Until: now})
	if err != nil {
		return nil, fmt.Errorf("doctor: ledger: %w", err)
	}
	prev, err := r.Counts(ctx, ledger.Window{Since: since.Add(-o.LedgerWindow), Until: since})
	if err != nil {
		return nil, fmt.Errorf("doctor: ledger: %w", err)
	}
	retrying, succeeded := cur.ByStatus[ledger.StatusRetrying], cur.ByStatus[ledger.StatusSucceeded]
	ev := fmt.Sprintf("in the last %s: %d retrying, %d succeeded", o.LedgerWindow, retrying, succeeded)
	if retrying >= int64(o.RetryStorm) && retrying > succeeded {
		fs = append(fs, Finding{ID: "ledger.retry-storm", Severity: Warn, Summary: "more jobs are retrying than succeeding: a dependency is down, or retries feed on themselves",
			Evidence: ev, Fix: "find the error (berth jobs -status retrying), fix the dependency; lengthen the backoff (WorkerOptions.Retry.Backoff) so retries do not pile on a struggling service"})
	} else {
		fs = append(fs, Finding{ID: "ledger.retry-storm", Severity: OK, Summary: "no retry storm", Evidence: ev})
	}
	nowDead, before := cur.ByStatus[ledger.StatusDead], prev.ByStatus[ledger.StatusDead]
	ev = fmt.Sprintf("%d dead letters in the last %s, %d in the %s before", nowDead, o.LedgerWindow, before, o.LedgerWindow)
	if nowDead >= int64(o.DLQGrowth) && nowDead > 2*before {
		fs = append(fs, Finding{ID: "ledger.dlq-growth", Severity: Warn, Summary: "the dead-letter queue is growing faster than before",
			Evidence: ev, Fix: "read the reasons (berth dlq list QUEUE), fix the cause, then redrive (berth dlq redrive QUEUE -class …)"})
	} else {
		fs = append(fs, Finding{ID: "ledger.dlq-growth", Severity: OK, Summary: "dead letters are not growing", Evidence: ev})
	}
	if ix, ok := r.(indexChecker); ok {
		// The findings above stand whatever this query does: its failure,
		// or its timeout, is a finding of its own.
		f, err := ledgerIndexes(ctx, ix, o)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	Sort(fs)
	return fs, nil
}

// indexChecker is a ledger reader on tables whose indexes doctor checks:
// pgledger.Store.
type indexChecker interface {
	Table() string
	Indexes(ctx context.Context) ([]pgledger.Index, error)
}

// ledgerIndexes is the ledger.indexes finding of ix's table: the indexes
// pgledger.SQL creates, present, valid and with its definition (an index
// of the right name made by hand, or by an earlier release with other
// columns, serves the queries no better than none). When they cannot be
// read it is an Info finding that says why (doctor.check-timeout when they
// did not answer in time); the error returned is that of a cancelled ctx.
func ledgerIndexes(ctx context.Context, ix indexChecker, o Options) (Finding, error) {
	table := strings.ReplaceAll(ix.Table(), `"`, "") // validated identifiers: quoted, never needing it
	ixs, err := ix.Indexes(ctx)
	switch {
	case err != nil && errors.Is(ctx.Err(), context.Canceled):
		return Finding{}, fmt.Errorf("doctor: ledger: %w", err)
	case err != nil && timedOut(ctx, err):
		// ctx is the check's own (Run bounds it with CheckTimeout): its
		// deadline is not the run's.
		return timeoutFinding(context.WithoutCancel(ctx), o, "ledger's index check", table, err), nil
	case err != nil:
		return Finding{ID: "ledger.indexes", Severity: Info, Queue: table, Summary: "the indexes of the ledger's jobs table could not be read: not checked",
			Evidence: err.Error(), Fix: "let doctor's database user read the catalog (pg_index) and the table, then run doctor again"}, nil
	}
	var bad []string
	var vs []indexVerdict
	building := 0
	for _, x := range ixs {
		v := classifyIndex(indexSpec{name: x.Name, cost: x.Cost, source: "pgledger.SQL", want: x.Want,
			create: x.Create(true), drop: x.Drop, replace: x.Replace(), rename: x.Rename(), renameNew: x.RenameNew()},
			pgindex.State{Found: x.Found, Valid: x.Valid, Building: x.Building, Matches: x.Matches, HeldBy: x.HeldBy,
				NewFound: x.NewFound, NewValid: x.NewValid, NewBuilding: x.NewBuilding, NewMatches: x.NewMatches, NewHeldBy: x.NewHeldBy,
				BuildHidden: x.BuildHidden, BuildUnknown: x.BuildUnknown})
		if v.ok {
			continue
		}
		bad = append(bad, v.evidence)
		vs = append(vs, v)
		if v.building || v.maybeBuilding {
			building++
		}
	}
	if len(bad) == 0 {
		return Finding{ID: "ledger.indexes", Severity: OK, Queue: table, Summary: "every index of the ledger's jobs table is present, as pgledger.SQL creates it",
			Evidence: fmt.Sprintf("%d indexes, none missing, invalid or defined otherwise", len(ixs))}, nil
	}
	fix := indexFix(vs, "the ledger's writes", "pgledger.Store.Migrate")
	if building == len(bad) {
		return Finding{ID: "ledger.indexes", Severity: Info, Queue: table, Summary: "indexes of the ledger's jobs table are being built",
			Evidence: strings.Join(bad, "; "), Fix: fix}, nil
	}
	return Finding{ID: "ledger.indexes", Severity: Warn, Queue: table, Summary: "indexes of the ledger's jobs table are missing, invalid or not as pgledger.SQL creates them",
		Evidence: strings.Join(bad, "; "), Fix: fix}, nil
}
