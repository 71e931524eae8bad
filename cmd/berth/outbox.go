package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// The outbox verbs work on the parked rows of a transactional outbox table
// (package outbox): rows the relay gave up on after its MaxAttempts.

// openOutbox opens the outbox table of -db (default $BERTH_DB) and -table.
func (c *cli) openOutbox(ctx context.Context) (*outbox.Outbox, func(), error) {
	box, _, closeBox, err := c.openOutboxPool(ctx)
	return box, closeBox, err
}

// openOutboxPool is openOutbox that also returns the outbox's pool.
func (c *cli) openOutboxPool(ctx context.Context) (*outbox.Outbox, *pgxpool.Pool, func(), error) {
	dsn := c.db
	if dsn == "" {
		dsn = c.getenv("BERTH_DB")
	}
	if dsn == "" {
		return nil, nil, nil, usagef("no database: give -db postgres://… or set BERTH_DB")
	}
	o := outbox.Options{}
	if c.table != "" {
		schema, table, ok := strings.Cut(c.table, ".")
		if !ok {
			schema, table = "", schema
		}
		// "app." or ".outbox" ("$SCHEMA.outbox" with SCHEMA unset) would
		// name the default table or schema: another table than the one meant.
		if table == "" || ok && schema == "" {
			return nil, nil, nil, usagef("-table \"%s\": want [schema.]table, neither of them empty", esc(c.table))
		}
		o.Schema, o.Table = schema, table
	}
	pool, err := c.openDBFor(ctx, dsn, "outbox")
	if err != nil {
		return nil, nil, nil, err
	}
	box, err := outbox.New(pool, o)
	if err != nil {
		pool.Close()
		if errors.Is(err, outbox.ErrInvalidIdentifier) {
			return nil, nil, nil, &usageError{err.Error()}
		}
		return nil, nil, nil, err
	}
	return box, pool, pool.Close, nil
}

type jsonParked struct {
	ID        int64       `json:"id"`
	Queue     string      `json:"queue"`
	Attempts  int         `json:"attempts"`
	LastError string      `json:"last_error"`
	CreatedAt string      `json:"created_at"` // RFC 3339, or "infinity" or "-infinity" (see outboxTime)
	ParkedAt  string      `json:"parked_at"`
	Message   dlq.Message `json:"message"`
}

type jsonParkedList struct {
	Total int          `json:"total"`
	Rows  []jsonParked `json:"rows"`
}

// outboxTime formats a parked row's time with layout, or says "infinity" or
// "-infinity" for one stored so (written or changed in the table by hand).
func outboxTime(t time.Time, inf pgtype.InfinityModifier, layout string) string {
	if inf != pgtype.Finite {
		return inf.String()
	}
	return t.Format(layout)
}

// outboxBatch is how many parked rows the outbox verbs read or change at a
// time, so that memory stays bounded however many rows are parked.
const outboxBatch = 1000

// countParked counts the parked rows, page by page of their ids, and
// returns the highest id seen (0 when none).
func countParked(ctx context.Context, box *outbox.Outbox) (n int, last int64, err error) {
	for {
		ids, err := box.ParkedIDs(ctx, last, outboxBatch)
		if err != nil {
			return n, last, err
		}
		if len(ids) == 0 {
			return n, last, nil
		}
		n += len(ids)
		last = ids[len(ids)-1]
	}
}

// countParkedUntil counts the rows parked at or before until (by the
// database's clock) with an id up to ceiling, reading their ids page by page.
func countParkedUntil(ctx context.Context, box *outbox.Outbox, ceiling int64, until time.Time) (int, error) {
	n, after := 0, int64(0)
	for {
		ids, err := box.ParkedIDsUntil(ctx, after, outboxBatch, until)
		if err != nil {
			return n, err
		}
		if i := slices.IndexFunc(ids, func(id int64) bool { return id > ceiling }); i >= 0 {
			return n + i, nil
		}
		if len(ids) == 0 {
			return n, nil
		}
		n += len(ids)
		after = ids[len(ids)-1]
	}
}

// missingParked returns those of ids that are not parked rows, in their
// order, reading the parked ids page by page.
func missingParked(ctx context.Context, box *outbox.Outbox, ids []int64) ([]int64, error) {
	left := map[int64]bool{}
	for _, id := range ids {
		left[id] = true
	}
	after := int64(0)
	for len(left) > 0 {
		page, err := box.ParkedIDs(ctx, after, outboxBatch)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		for _, id := range page {
			delete(left, id)
		}
		after = page[len(page)-1]
	}
	var missing []int64
	for _, id := range ids {
		if left[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

func runOutboxList(ctx context.Context, c *cli, args []string) error {
	if len(args) != 0 {
		return usagef("outbox list takes no arguments")
	}
	if c.limit < 0 {
		return usagef("-limit must not be negative")
	}
	box, closeBox, err := c.openOutbox(ctx)
	if err != nil {
		return err
	}
	defer closeBox()
	limit := c.limit
	if limit == 0 {
		limit = 50
	}
	total, _, err := countParked(ctx, box) // ids only: bounded memory however many are parked
	if err != nil {
		return err
	}
	shown, err := box.Parked(ctx, limit) // the rows shown, with their messages
	if err != nil {
		return err
	}
	total = max(total, len(shown)) // rows parked between the two reads
	if c.json {
		v := jsonParkedList{Total: total, Rows: make([]jsonParked, 0, len(shown))}
		for _, p := range shown {
			v.Rows = append(v.Rows, jsonParked{p.ID, p.Queue, p.Attempts, p.LastError,
				outboxTime(p.CreatedAt, p.CreatedAtInfinity, time.RFC3339Nano), outboxTime(p.ParkedAt, p.ParkedAtInfinity, time.RFC3339Nano),
				dlq.View(p.Message)})
		}
		if err := writeJSON(c.stdout, v); err != nil {
			return err
		}
	} else {
		if len(shown) > 0 {
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tQUEUE\tTYPE\tATTEMPTS\tPARKED\tLAST ERROR")
			for _, p := range shown {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", p.ID, oneLine(p.Queue, 30), oneLine(p.Message.Type, 40), p.Attempts,
					outboxTime(p.ParkedAt.UTC(), p.ParkedAtInfinity, time.RFC3339), oneLine(p.LastError, 80))
			}
			_ = tw.Flush()
		}
		fmt.Fprintf(c.stdout, "%d parked row(s)", total)
		if len(shown) < total {
			fmt.Fprintf(c.stdout, ", %d shown (-limit)", len(shown))
		}
		fmt.Fprintln(c.stdout)
	}
	if total == 0 {
		return fmt.Errorf("no parked rows: %w", errNothing)
	}
	return nil
}

// jsonOutboxChange is the -json document of outbox requeue|discard.
type jsonOutboxChange struct {
	Action string `json:"action"` // "requeue" or "discard"
	DryRun bool   `json:"dry_run"`
	// Matched is how many parked rows were chosen (and confirmed); when all
	// were chosen with -yes, uncounted, it is how many were found. Of named
	// rows, it counts those that are parked.
	Matched     int    `json:"matched"`
	Done        int    `json:"done"`
	Interrupted bool   `json:"interrupted"`
	Error       string `json:"error,omitempty"` // why it stopped part-way
	// Missed counts the named rows that are not parked rows (absent, or
	// pending: requeued already), which are not changed; Failed names the
	// first outboxNamed of them.
	Missed int                 `json:"missed"`
	Failed []jsonOutboxFailure `json:"failed"`
}

// jsonOutboxFailure is a named row that was not changed, and why.
type jsonOutboxFailure struct {
	ID    int64  `json:"id"`
	Error string `json:"error"`
}

// outboxNamed bounds how many rows that are not parked an outbox change
// names, as dlq.MaxFailures bounds a dead-letter change's: the others are
// counted ("… and N more").
const outboxNamed = dlq.MaxFailures

// notParkedWhy says why a named row was not changed.
const notParkedWhy = "not a parked row (no such row, or not parked: pending, requeued or relayed)"

func outboxFailures(ids []int64) []jsonOutboxFailure {
	out := make([]jsonOutboxFailure, 0, min(len(ids), outboxNamed))
	for _, id := range ids[:min(len(ids), outboxNamed)] {
		out = append(out, jsonOutboxFailure{ID: id, Error: notParkedWhy})
	}
	return out
}

// printNotParked names the first outboxNamed of ids, one a line, each as
// format has it (with the id and why), then counts the others after more.
func (c *cli) printNotParked(ids []int64, format, more string) {
	for _, id := range ids[:min(len(ids), outboxNamed)] {
		fmt.Fprintf(c.stdout, format, id)
	}
	if len(ids) > outboxNamed {
		fmt.Fprintf(c.stdout, "… and %d more %s\n", len(ids)-outboxNamed, more)
	}
}

// runOutboxChange requeues or discards parked rows: the ids given, or all.
// After a confirmation it changes only the rows it counted: at most that
// many, none parked after the count; it works in batches of outboxBatch
// rows, and reports what it did when it stops part-way. Named rows that
// are not parked are left and named (exit 4, 3 when none is parked) by a
// requeue; a discard, which cannot be undone, then changes nothing (3).
func runOutboxChange(ctx context.Context, c *cli, args []string, discard bool) (err error) {
	changing := false // from here on, the report says what was changed
	defer func() {
		if !changing {
			err = interruptedBeforeChange(ctx, err)
		}
	}()
	var ids []int64
	seen := map[int64]bool{}
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return usagef("row ids are integers (from berth outbox list), not \"%s\"", esc(a))
		}
		if !seen[id] { // a row is changed once, however often it is named
			seen[id] = true
			ids = append(ids, id)
		}
	}
	named := len(ids) > 0
	if err := c.mayChange(); err != nil { // before the table is read
		return err
	}
	verb, done := "requeue", "requeued"
	if discard {
		verb, done = "discard", "discarded"
	}
	box, pool, closeBox, err := c.openOutboxPool(ctx)
	if err != nil {
		return err
	}
	defer closeBox()
	report := jsonOutboxChange{Action: verb, DryRun: c.dryRun, Matched: -1, Failed: []jsonOutboxFailure{}}
	var notParked []int64 // named rows that are not parked rows
	if named {
		if notParked, err = missingParked(ctx, box, ids); err != nil {
			return err
		}
		ids = withoutIDs(ids, notParked)
		report.Matched, report.Missed, report.Failed = len(ids), len(notParked), outboxFailures(notParked)
		if discard && len(notParked) > 0 {
			// A discard cannot be undone: a list of rows some of which are
			// not parked (from another table, or already dealt with) is
			// not taken in part.
			if c.json {
				if err := writeJSON(c.stdout, report); err != nil {
					return err
				}
			} else {
				c.printNotParked(notParked, "not a parked row: %d\n", "not parked")
			}
			return fmt.Errorf("%d of the %d named rows are not parked rows (listed above): nothing changed (a discard takes all the named rows or none): %w",
				len(notParked), len(ids)+len(notParked), sdk.ErrNotFound)
		}
	}
	ceiling := int64(math.MaxInt64) // all: the highest id counted
	// all, counted: the database's time after the count. A row parked
	// after it is not among the rows counted, whatever its id (a row is
	// parked long after it was added: its id is usually lower than those
	// of rows counted), and is left alone.
	var until *time.Time
	if c.dryRun || !c.yes {
		if !named {
			report.Matched, ceiling, err = countParked(ctx, box)
			if err != nil {
				return err
			}
			var t time.Time
			if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
				return fmt.Errorf("outbox: reading the database's time: %w", err)
			}
			until = &t
		}
		n := report.Matched
		if c.dryRun {
			if c.json {
				if err := writeJSON(c.stdout, report); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(c.stdout, "dry run: would %s %d parked row(s); nothing changed\n", verb, n)
				c.printNotParked(notParked, "not a parked row: %d\n", "not parked")
			}
			switch {
			case n == 0 && named:
				return fmt.Errorf("none of the named rows is parked (listed above): %w", errNothing)
			case n == 0:
				return fmt.Errorf("no parked rows: %w", errNothing)
			case len(notParked) > 0:
				// The change would exit 4 for them, as a dlq dry run does.
				return &partialError{msg: fmt.Sprintf("the dry run found %d of the named rows not parked (listed above): the change would not %s them", len(notParked), verb)}
			}
			return nil
		}
		if n == 0 && !named {
			return fmt.Errorf("no parked rows: %w", errNothing)
		}
		if n > 0 {
			left := ""
			if len(notParked) > 0 {
				left = fmt.Sprintf(" (%d of the named rows are not parked: they are left, and named after)", len(notParked))
			}
			q := fmt.Sprintf("%s %d parked row(s) (the relay publishes them again)%s?", verb, n, left)
			if discard {
				q = fmt.Sprintf("discard %d parked row(s) (their messages are never published)?", n)
			}
			if err := c.confirm(ctx, q); err != nil {
				return err
			}
		}
		if until != nil {
			// A relay pass parks rows (parked_at) inside its transaction
			// and commits after its publish: a row it parked before the
			// count but committed after was not counted, yet is parked
			// before until, and would be changed in place of a counted
			// row (the change stops at the count). Counted again now, it
			// shows: change nothing.
			again, err := countParkedUntil(ctx, box, ceiling, *until)
			if err != nil {
				return err
			}
			if again > report.Matched {
				return fmt.Errorf("%d row(s) parked before the count were not in it (a relay pass that parked them was still under way): nothing changed; run it again", again-report.Matched)
			}
		}
	}

	var bar *progressbar.ProgressBar
	if c.progress && (!named || len(ids) > 0) {
		bar = progressbar.NewOptions64(int64(report.Matched),
			progressbar.OptionSetWriter(c.stderr),
			progressbar.OptionSetDescription(verb+" parked rows"),
			progressbar.OptionShowCount(),
			progressbar.OptionThrottle(barThrottle),
			progressbar.OptionFullWidth(),
			// No spinner goroutine (all with -yes: the count is unknown,
			// -1): see runChange.
			progressbar.OptionSetSpinnerChangeInterval(0),
		)
	}
	changing = true
	var (
		n    int
		gone []int64
	)
	if !named || len(ids) > 0 { // (named rows none of which is parked: nothing to change, and no ids would mean all)
		n, gone, err = changeParked(ctx, box, ids, report.Matched, ceiling, until, discard, func(n int) {
			if bar != nil {
				_ = bar.Set(n)
			}
		})
	}
	if bar != nil {
		_ = bar.Exit()
		fmt.Fprintln(c.stderr)
	}
	notParked = append(notParked, gone...) // named rows that left the parked state since they were read
	report.Done, report.Missed, report.Failed = n, len(notParked), outboxFailures(notParked)
	if report.Matched < 0 {
		report.Matched = n // all, with -yes: as many as were found
	}
	report.Interrupted = err != nil && ctx.Err() != nil
	if err != nil && n == 0 && !report.Interrupted {
		return err // nothing changed
	}
	if err != nil {
		report.Error = err.Error()
	}
	if c.json {
		if err := writeJSON(c.stdout, report); err != nil {
			return err
		}
	} else {
		before := ""
		if err != nil && !report.Interrupted {
			before = " before the error"
		}
		fmt.Fprintf(c.stdout, "%s %d parked row(s)%s\n", done, n, before)
		c.printNotParked(notParked, "not "+done+": %d: "+notParkedWhy+"\n", "not "+done)
	}
	switch {
	case report.Interrupted && n == 0:
		return &partialError{msg: fmt.Sprintf("interrupted (%v) before any of the chosen parked rows was %s; nothing changed", ctx.Err(), done)}
	case report.Interrupted:
		return &partialError{msg: fmt.Sprintf("interrupted (%v) after %d of the chosen parked rows were %s; run it again to continue", ctx.Err(), n, done)}
	case err != nil:
		return &partialError{msg: fmt.Sprintf("%d parked row(s) were %s, then: %v; run it again for the rest", n, done, err), err: err}
	case named && n == 0:
		return fmt.Errorf("none of the named rows is parked (listed above): %w", errNothing)
	case len(notParked) > 0:
		return &partialError{msg: fmt.Sprintf("%d of the named rows were not %s: not parked rows (listed above)", len(notParked), done)}
	case report.Matched > n:
		return &partialError{msg: fmt.Sprintf("%d of the %d chosen parked rows were no longer parked (requeued, discarded or relayed meanwhile)", report.Matched-n, report.Matched)}
	case n == 0:
		return fmt.Errorf("no parked rows: %w", errNothing)
	}
	return nil
}

// withoutIDs returns ids without those in drop, in their order (ids is
// reused).
func withoutIDs(ids, drop []int64) []int64 {
	set := make(map[int64]bool, len(drop))
	for _, id := range drop {
		set[id] = true
	}
	return slices.DeleteFunc(ids, func(id int64) bool { return set[id] })
}

// changeParked requeues or discards parked rows in batches and returns how
// many it changed: the ids given, or else at most limit (all when limit < 0)
// of the rows parked with an id up to ceiling, and (when until is not nil)
// at or before until by the database's clock, oldest first. Each batch is
// one transaction, not cut by ctx; ctx is checked between batches. Of the
// ids given, those no longer parked when their batch is changed are left
// and returned (gone). On an error it returns the count done before it.
func changeParked(ctx context.Context, box *outbox.Outbox, ids []int64, limit int, ceiling int64, until *time.Time, discard bool, progress func(done int)) (int, []int64, error) {
	do := func(batch []int64) (int, error) {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlq.PageTimeout)
		defer cancel()
		if discard {
			return box.Discard(bctx, batch...)
		}
		return box.Requeue(bctx, batch...)
	}
	done := 0
	var gone []int64
	if len(ids) > 0 {
		for batch := range slices.Chunk(ids, outboxBatch) {
			if err := ctx.Err(); err != nil {
				return done, gone, err
			}
			n, err := do(batch)
			for retries := 0; errors.Is(err, sdk.ErrNotFound) && retries < 3; retries++ {
				// A row of the batch left the parked state since it was
				// read (the batch changed nothing): leave those, change
				// the others.
				left, merr := missingParked(ctx, box, batch)
				if merr != nil {
					return done, gone, merr
				}
				gone = append(gone, left...)
				batch = withoutIDs(slices.Clone(batch), left)
				if n, err = 0, nil; len(batch) > 0 {
					n, err = do(batch)
				}
			}
			if err != nil {
				return done, gone, err
			}
			done += n
			progress(done)
		}
		return done, gone, nil
	}
	after, retries := int64(0), 0
	for limit < 0 || done < limit {
		if err := ctx.Err(); err != nil {
			return done, nil, err
		}
		want := outboxBatch
		if limit >= 0 {
			want = min(want, limit-done)
		}
		var (
			page []int64
			err  error
		)
		if until != nil {
			page, err = box.ParkedIDsUntil(ctx, after, want, *until)
		} else {
			page, err = box.ParkedIDs(ctx, after, want)
		}
		if err != nil {
			return done, nil, err
		}
		if i := slices.IndexFunc(page, func(id int64) bool { return id > ceiling }); i >= 0 {
			page = page[:i] // parked after the count: not confirmed
		}
		if len(page) == 0 {
			break
		}
		n, err := do(page)
		if errors.Is(err, sdk.ErrNotFound) && retries < 3 {
			retries++ // a row of the page left the parked state meanwhile; the batch changed nothing: read it again
			continue
		}
		if err != nil {
			return done, nil, err
		}
		retries = 0
		done += n
		after = page[len(page)-1]
		progress(done)
	}
	return done, nil, nil
}
