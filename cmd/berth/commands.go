package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// hungRefresh is the least a refresh of stats -watch has waited, when the
// -timeout given ends the watch, for it to be reported as getting no
// answer (exit 1) rather than the watch's normal end: -interval, and at
// least this, so that a deadline falling inside a refresh under way is not
// taken for a broker that stopped answering. A refresh cut before any
// refresh answered is always reported: the watch showed nothing.
const hungRefresh = time.Second

// runStats prints the statistics of the queues in args (every queue when
// none), with -watch every -interval until interrupted or until the
// -timeout given; each refresh then has c.refreshTimeout.
func runStats(ctx context.Context, c *cli, args []string) error {
	if c.interval <= 0 {
		return usagef("-interval must be positive")
	}
	b, err := c.broker(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	in, ok := b.(sdk.Inspector)
	if !ok {
		return fmt.Errorf("this broker cannot report statistics")
	}
	answered := false // a refresh of -watch was printed
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if c.refreshTimeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, c.refreshTimeout)
		}
		start := time.Now()
		all, err := statsRound(rctx, b, in, args)
		waited := time.Since(start)
		cancel()
		if err != nil {
			if c.watch && errors.Is(ctx.Err(), context.DeadlineExceeded) && (!answered || waited >= max(c.interval, hungRefresh)) {
				// The -timeout given ended the watch while a refresh
				// waited for an answer it had not had in -interval: the
				// broker stopped answering, not a deadline that fell
				// inside a refresh under way. (run says "gave up after".)
				return fmt.Errorf("a refresh of -watch had waited %s with no answer: %w", waited.Round(10*time.Millisecond), err)
			}
			if c.watch && ctx.Err() != nil {
				return nil // -watch ends when interrupted, or at the -timeout given
			}
			if c.refreshTimeout > 0 && errors.Is(rctx.Err(), context.DeadlineExceeded) {
				if c.timeout > 0 {
					return fmt.Errorf("a refresh of -watch got no answer within %s (each refresh's bound, the default -timeout of stats; "+
						"the -timeout given, %s, bounds the whole watch): %w", c.refreshTimeout, c.timeout, err)
				}
				return fmt.Errorf("a refresh of -watch got no answer within %s (the default -timeout of stats, for each refresh; "+
					"-timeout bounds the whole watch instead): %w", c.refreshTimeout, err)
			}
			return err
		}
		answered = true
		if err := c.printStats(all); err != nil {
			return err
		}
		if !c.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // -watch ends when interrupted
		case <-time.After(c.interval):
		}
	}
}

// statsRound reads the statistics of the queues named in args, or of every
// queue the broker lists when there are none.
func statsRound(ctx context.Context, b sdk.Broker, in sdk.Inspector, args []string) ([]sdk.QueueStats, error) {
	queues := args
	if len(args) == 0 {
		ql, ok := b.(dlq.QueueLister)
		if !ok {
			return nil, usagef("this broker cannot list its queues: name them (berth stats QUEUE...)")
		}
		var err error
		if queues, err = ql.Queues(ctx); err != nil {
			return nil, err
		}
	}
	all := make([]sdk.QueueStats, 0, len(queues))
	for _, q := range queues {
		st, err := in.Stats(ctx, q)
		if err != nil {
			if len(args) == 0 && errors.Is(err, sdk.ErrNotFound) {
				continue // deleted since the broker listed it
			}
			return nil, fmt.Errorf("stats %s: %w", esc(q), err)
		}
		all = append(all, st)
	}
	return all, nil
}

func (c *cli) printStats(all []sdk.QueueStats) error {
	if c.json {
		v := jsonStats{Time: time.Now().UTC(), Queues: make([]jsonQueue, 0, len(all))}
		for _, s := range all {
			v.Queues = append(v.Queues, jsonQueue{s.Queue, s.Ready, s.Delayed, s.InFlight, s.DeadLettered, s.OldestAge.Seconds()})
		}
		return writeJSON(c.stdout, v)
	}
	if c.watch {
		fmt.Fprintf(c.stdout, "%s\n", time.Now().Format(time.TimeOnly))
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tREADY\tDELAYED\tIN FLIGHT\tDEAD\tOLDEST")
	for _, s := range all {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", esc(s.Queue), s.Ready, s.Delayed, s.InFlight, s.DeadLettered, s.OldestAge.Round(time.Millisecond))
	}
	if len(all) == 0 {
		fmt.Fprintln(tw, "(no queues)")
	}
	return tw.Flush()
}

// filter builds the dead-letter filter of the command line.
func (c *cli) filter(ids []string) (dlq.Filter, error) {
	f := dlq.Filter{IDs: ids, Class: c.class, OlderThan: c.olderThan, NewerThan: c.newerThan}
	if c.types != "" {
		for _, t := range strings.Split(c.types, ",") {
			if t = strings.TrimSpace(t); t != "" {
				f.Types = append(f.Types, t)
			}
		}
	}
	if err := f.ParseReason(c.reason); err != nil {
		return f, &usageError{err.Error()}
	}
	// A filter flag given an empty value (a script's unset variable: -type
	// "$TYPE") would narrow nothing: a purge would choose every dead letter.
	// So would an empty regexp (-reason "/$RE/" with RE unset: "//").
	for _, name := range flagsGiven(c.fs) {
		empty := map[string]bool{"type": len(f.Types) == 0, "class": c.class == "", "reason": c.reason == "" || c.reason == "//"}
		if empty[name] {
			return f, usagef("-%s is empty: give a value, or leave the flag out to choose every dead letter", name)
		}
	}
	if c.olderThan < 0 || c.newerThan < 0 || c.limit < 0 || c.offset < 0 || c.pageSize <= 0 || c.scanLimit <= 0 {
		return f, usagef("-older-than, -newer-than, -limit and -offset must not be negative, -page-size and -scan-limit must be positive")
	}
	return f, nil
}

func (c *cli) deadLetters(ctx context.Context) (sdk.Broker, sdk.DeadLetters, error) {
	b, err := c.broker(ctx)
	if err != nil {
		return nil, nil, err
	}
	dl, ok := b.(sdk.DeadLetters)
	if !ok {
		b.Close()
		return nil, nil, fmt.Errorf("this broker has no dead-letter operations")
	}
	return b, dl, nil
}

func runList(ctx context.Context, c *cli, args []string) error {
	if len(args) != 1 {
		return usagef("want exactly one QUEUE, got %d arguments", len(args))
	}
	queue := args[0]
	f, err := c.filter(nil)
	if err != nil {
		return err
	}
	limit := c.limit
	if limit == 0 {
		limit = 50
	}
	b, dl, err := c.deadLetters(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	o, stopScan := c.scanProgress(dlq.Options{PageSize: c.pageSize, ScanLimit: c.scanLimit}, "counting "+esc(queue))
	l, err := dlq.List(ctx, dl, queue, f, c.offset, limit, o)
	stopScan()
	if err != nil {
		return err
	}
	var total *int64
	if l.Total >= 0 {
		total = &l.Total
	}
	var next *int
	if l.Next >= 0 {
		next = &l.Next
	}
	shown, matched, complete := l.Messages, l.Matched, l.Complete
	if c.json {
		v := jsonList{Queue: queue, TotalDeadLetters: total, Matched: matched, Complete: complete, Incomplete: l.Incomplete, Offset: c.offset, Limit: limit,
			NextOffset: next, Messages: make([]dlq.Message, 0, len(shown))}
		for _, m := range shown {
			v.Messages = append(v.Messages, dlq.View(m))
		}
		if err := writeJSON(c.stdout, v); err != nil {
			return err
		}
	} else {
		if len(shown) > 0 {
			printTable(c.stdout, shown)
		}
		what := fmt.Sprintf("%d matching", matched)
		if !complete {
			why := "the broker lists only the first of its dead letters"
			if l.Incomplete != "" {
				why = esc(l.Incomplete)
			}
			what = fmt.Sprintf("at least %d matching (%s)", matched, why)
		}
		if f.IsZero() && complete {
			what = fmt.Sprintf("%d", matched)
		}
		switch {
		case len(shown) == 0:
			fmt.Fprintf(c.stdout, "no dead letters shown of %s", what)
		default:
			fmt.Fprintf(c.stdout, "dead letters %d-%d of %s", c.offset+1, c.offset+len(shown), what)
		}
		if total != nil && !f.IsZero() {
			fmt.Fprintf(c.stdout, " (%d in the dead-letter queue of %s)", *total, esc(queue))
		}
		fmt.Fprintln(c.stdout)
		if next != nil {
			fmt.Fprintf(c.stdout, "next page: -offset %d\n", *next)
		}
	}
	if !complete {
		// A partial list is not a list of them all: exit 4, so that a
		// script does not take it for one (nor "nothing matched" for
		// "none of the first -scan-limit matched").
		return &partialError{msg: fmt.Sprintf("the list is partial: the scan stopped before the end of the dead-letter queue of %s, "+
			"so more than %d may match; raise -scan-limit (it was %d) or narrow the filter to see the rest, or run it again", esc(queue), matched, c.scanLimit)}
	}
	if matched == 0 {
		return fmt.Errorf("%s: %w", esc(queue), errNothing)
	}
	return nil
}

func printTable(w io.Writer, msgs []*sdk.Message) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tATTEMPTS\tCLASS\tLAST FAILURE\tREASON")
	var cut bool
	for _, m := range msgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", idCell(m.ID, &cut), oneLine(m.Type, 40), oneLine(m.Header(sdk.HeaderDeadLetterAttempts), 6),
			oneLine(m.Header(sdk.HeaderDeadLetterClass), 12), oneLine(m.Header(sdk.HeaderLastFailure), 35), oneLine(m.Header(sdk.HeaderDeadLetterReason), 80))
	}
	_ = tw.Flush()
	if cut {
		fmt.Fprintln(w, cutIDsNote)
	}
}

func runShow(ctx context.Context, c *cli, args []string) error {
	if len(args) != 2 {
		return usagef("want QUEUE and ID, got %d arguments", len(args))
	}
	b, dl, err := c.deadLetters(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	m, err := dl.GetDeadLetter(ctx, args[0], args[1])
	if dlq.ScanIncomplete(err) {
		// Neither found nor known to be missing (an SQS scan held too
		// many letters, or others were held invisible by another reader):
		// a partial answer, exit 4 as a partial list, not an error.
		return &partialError{msg: fmt.Sprintf("dead letter %s of %s was not found, but the scan stopped before the end of the dead-letter queue: %v; run it again",
			esc(args[1]), esc(args[0]), err), err: err}
	}
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, dlq.View(m))
	}
	h := dlq.HistoryOf(m)
	w := c.stdout
	fmt.Fprintf(w, "id:              %s\ntype:            %s\n", esc(m.ID), esc(m.Type))
	if m.IdempotencyKey != "" {
		fmt.Fprintf(w, "idempotency key: %s\n", esc(m.IdempotencyKey))
	}
	if m.Key != "" {
		fmt.Fprintf(w, "key:             %s\n", esc(m.Key))
	}
	if m.CorrelationID != "" {
		fmt.Fprintf(w, "correlation id:  %s\n", esc(m.CorrelationID))
	}
	fmt.Fprintf(w, "failure:\n  reason:        %s\n  class:         %s\n  attempts:      %d\n  first failure: %s\n  last failure:  %s\n  redriven:      %d time(s)\n",
		esc(h.Reason), esc(h.Class), h.Attempts, esc(h.FirstFailure), esc(h.LastFailure), h.RedriveCount)
	fmt.Fprintln(w, "headers:")
	for _, k := range sortedKeys(m.Headers) {
		fmt.Fprintf(w, "  %s: %s\n", esc(k), esc(m.Headers[k]))
	}
	j := dlq.View(m)
	if j.BodyEncoding == "base64" {
		fmt.Fprintf(w, "body (%d bytes, not UTF-8, base64):\n%s\n", len(m.Body), j.Body)
		return nil
	}
	body := escBlock(string(m.Body))
	if json.Valid(m.Body) {
		body = dlq.EscapeJSONText(string(m.Body)) // JSON as JSON: its backslashes are its own escapes
	}
	fmt.Fprintf(w, "body (%d bytes):\n%s\n", len(m.Body), body)
	return nil
}

type action int

const (
	actRedrive action = iota
	actPurge
)

func runChange(ctx context.Context, c *cli, args []string, act action) (err error) {
	applying := false // from here on, the report says what was changed
	defer func() {
		if !applying {
			err = interruptedBeforeChange(ctx, err)
		}
	}()
	if len(args) < 1 {
		return usagef("want QUEUE [ID...]")
	}
	queue, ids := args[0], args[1:]
	f, err := c.filter(ids)
	if err != nil {
		return err
	}
	if err := c.mayChange(); err != nil {
		return err
	}
	verb, done := "redrive", "redriven"
	dact := dlq.Redrive
	if act == actPurge {
		verb, done, dact = "purge", "purged", dlq.Delete
	}
	b, dl, err := c.deadLetters(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	o := dlq.Options{PageSize: c.pageSize, Limit: c.limit, ScanLimit: c.scanLimit}
	report := jsonChange{Action: verb, Queue: queue, DryRun: c.dryRun, Failed: []jsonFailure{}}
	barTotal := int64(-1) // the progress bar's total, when the confirmation counted it

	if c.dryRun || !c.yes {
		po, stopScan := c.scanProgress(o, "counting "+esc(queue))
		s, first, missing, err := dlq.Preview(ctx, dl, queue, f, po, 20)
		stopScan()
		if err != nil {
			return err
		}
		// The letters the change would leave, their IDs held by dead
		// letters the filter does not choose too, are missed as it misses
		// them (exit 4).
		report.Matched, report.Complete, report.Incomplete, report.Missed = s.Matched, s.Complete, s.Incomplete, len(missing)+s.Withheld
		fs := make([]dlq.Failure, 0, len(missing)+len(s.WithheldIDs))
		for _, id := range missing {
			fs = append(fs, dlq.Failure{ID: id, Err: sdk.ErrNotFound})
		}
		// The IDs it would leave, named as the change names them.
		fs = append(fs, s.WithheldIDs...)
		report.Failed = failures(fs) // id_base64 for an ID that is not UTF-8, as the change's

		if c.dryRun {
			return c.printDryRun(report, first, verb, missing, s)
		}
		if s.Matched == 0 || s.Matched == s.Withheld {
			// Nothing to confirm: the answer names the IDs that are not
			// dead letters, as -yes and a dry run do.
			if c.json {
				if err := writeJSON(c.stdout, report); err != nil {
					return err
				}
			} else {
				c.printMissing(queue, missing)
			}
		}
		if s.Matched == 0 && s.Incomplete != "" {
			// As a dry run: "none of the first -scan-limit matched" is
			// not "nothing matched" (exit 3), nor an answer to confirm.
			return &partialError{msg: fmt.Sprintf("none of the dead letters read matches, but the scan stopped before the end of the dead-letter queue of %s (%s), "+
				"so some may; raise -scan-limit (it was %d) or narrow the filter; nothing changed", esc(queue), s.Incomplete, c.scanLimit)}
		}
		if s.Matched == 0 {
			return fmt.Errorf("no dead letter of %s matches: %w", esc(queue), errNothing)
		}
		if s.Matched == s.Withheld {
			return &partialError{msg: fmt.Sprintf("%d dead letter(s) of %s match, but %s; nothing changed", s.Matched, esc(queue), withheldWhy)}
		}
		n := fmt.Sprint(s.Matched - s.Withheld)
		if s.Incomplete != "" {
			// A count from a capped scan: at most these are changed
			// (Limit below), more may match.
			n = fmt.Sprintf("the %d found (the scan stopped before the end of the dead-letter queue: more may match)", s.Matched-s.Withheld)
		}
		if s.Withheld > 0 {
			// The change, limited to s.Matched below, leaves them.
			n += fmt.Sprintf(" (%d more match, but are left: %s)", s.Withheld, withheldWhy)
		}
		if s.Shared > 0 {
			// A change of an ID moves every letter holding it: say why
			// the count is more than the IDs named.
			n += fmt.Sprintf(" (%d of them share their ID with other dead letters: each ID changes every letter holding it)", s.Shared)
		}
		q := fmt.Sprintf("%s %s dead letter(s) of %s?", verb, n, esc(queue))
		if act == actPurge {
			q = fmt.Sprintf("delete %s dead letter(s) of %s for good?", n, esc(queue))
		}
		if err := c.confirm(ctx, q); err != nil {
			return err
		}
		o.Limit = s.Matched // never more than was confirmed
		// The letters it leaves (Withheld) are walked, within Limit, but
		// not moved: the bar counts those it moves.
		barTotal = int64(s.Matched - s.Withheld)
	}

	var bar *progressbar.ProgressBar
	total := barTotal
	if c.progress {
		if total < 0 { // -yes: what the broker counts, or -limit
			if f.IsZero() {
				if in, ok := b.(sdk.Inspector); ok {
					if st, err := in.Stats(ctx, queue); err == nil {
						total = st.DeadLettered
					}
				}
			}
			if o.Limit > 0 && (total < 0 || int64(o.Limit) < total) {
				total = int64(o.Limit)
			}
		}
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(c.stderr),
			progressbar.OptionSetDescription(verb+" "+esc(queue)),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("msg"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(barThrottle),
			progressbar.OptionFullWidth(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(c.stderr) }),
			// No spinner goroutine (an unknown count, total -1): it would
			// redraw until the bar is finished, which Exit is not, over
			// the report and after the command (see scanProgress).
			progressbar.OptionSetSpinnerChangeInterval(0),
		)
	}
	applying = true
	r, err := dlq.Apply(ctx, dl, queue, f, dact, o, func(n int) {
		if bar != nil {
			_ = bar.Set(n)
		}
	})
	if bar != nil {
		if barTotal < 0 && total >= 0 && err == nil && r.Withheld > 0 {
			// -yes: the total (-limit, or what the broker counts) included
			// the letters the change left (Withheld), which only its walk
			// could tell: the bar counts those it acted on, as after a
			// confirmation.
			bar.ChangeMax64(max(total-int64(r.Withheld), int64(r.Done)))
		}
		_ = bar.Exit()
		fmt.Fprintln(c.stderr)
	}
	interrupted := err != nil && ctx.Err() != nil
	var stopped error // the error that stopped Apply part-way (not an interrupt)
	if err != nil && !interrupted {
		if r.Done == 0 && r.Missed == 0 {
			return err // nothing was changed
		}
		stopped = err
		report.Error = err.Error()
	}
	report.Matched, report.Done, report.Missed, report.Complete, report.Interrupted = r.Matched, r.Done, r.Missed, r.Complete, interrupted
	report.Incomplete = r.Incomplete
	left := int64(-1) // what the broker still counts, when it stopped early
	if r.Incomplete != "" && !interrupted && stopped == nil {
		if in, ok := b.(sdk.Inspector); ok {
			if st, err := in.Stats(ctx, queue); err == nil {
				left = st.DeadLettered
			}
		}
	}
	report.Failed = failures(r.Failed)
	if c.json {
		if err := writeJSON(c.stdout, report); err != nil {
			return err
		}
	} else {
		before := ""
		if stopped != nil {
			before = " before the error"
		}
		fmt.Fprintf(c.stdout, "%s %d dead letter(s) of %s%s\n", done, r.Done, esc(queue), before)
		for _, fl := range r.Failed {
			fmt.Fprintf(c.stdout, "not %s: %s: %s\n", done, esc(fl.ID), errText(fl.Err))
		}
		if n := r.Unnamed(); n > 0 { // (a failure names an ID for all its letters)
			fmt.Fprintf(c.stdout, "… and %d more not %s\n", n, done)
		}
		if r.Incomplete != "" && !interrupted {
			fmt.Fprintf(c.stdout, "the scan stopped before the end of the dead-letter queue: %s\n", esc(r.Incomplete))
			if left >= 0 {
				fmt.Fprintf(c.stdout, "the broker still counts %d dead letter(s) in the dead-letter queue of %s\n", left, esc(queue))
			}
		}
	}
	switch {
	case stopped != nil && r.Done > 0:
		return &partialError{msg: fmt.Sprintf("%s %d dead letter(s), then: %v; run it again for the rest", done, r.Done, stopped), err: stopped}
	case stopped != nil:
		return stopped
	case interrupted && r.Done == 0:
		return &partialError{msg: fmt.Sprintf("interrupted (%v) before any of the chosen dead letters was %s; nothing changed", ctx.Err(), done)}
	case interrupted:
		return &partialError{msg: fmt.Sprintf("interrupted (%v) after %d of the chosen dead letters were %s; run it again to continue", ctx.Err(), r.Done, done)}
	case r.Incomplete != "":
		return &partialError{msg: fmt.Sprintf("%s %d dead letter(s), but the scan stopped before the end of the dead-letter queue; more may match: run it again to continue", done, r.Done)}
	case r.Matched == 0 && r.Done == 0 && !slices.ContainsFunc(r.Failed, func(f dlq.Failure) bool { return errors.Is(f.Err, dlq.ErrOverLimit) }):
		// Named IDs none of which is a dead letter (listed above) are
		// "nothing matched", as the confirmation and a dry run say (not
		// IDs held by more letters than the change could touch).
		return fmt.Errorf("no dead letter of %s matches: %w", esc(queue), errNothing)
	case r.Missed > 0:
		return &partialError{msg: fmt.Sprintf("%d of the chosen dead letters were not %s (listed above)", r.Missed, done)}
	}
	return nil
}

// printMissing names the IDs of missing, named but not dead letters of
// queue: the first [dlq.MaxFailures] of them, as a change names those it
// missed, then how many more.
func (c *cli) printMissing(queue string, missing []string) {
	for _, id := range missing[:min(len(missing), dlq.MaxFailures)] {
		fmt.Fprintf(c.stdout, "not a dead letter of %s: %s\n", esc(queue), esc(id))
	}
	if n := len(missing) - dlq.MaxFailures; n > 0 {
		fmt.Fprintf(c.stdout, "… and %d more not dead letters of %s\n", n, esc(queue))
	}
}

// barThrottle is how often at most a progress bar redraws (tests lower it
// to see every count a change reports).
var barThrottle = 100 * time.Millisecond

// scanProgress returns o with a progress line on a terminal (-progress)
// that counts the dead letters a scan reads, and the func that ends it: the
// count before a confirmation or a dry run's answer walks the whole
// dead-letter queue, which can take minutes.
func (c *cli) scanProgress(o dlq.Options, what string) (dlq.Options, func()) {
	if !c.progress {
		return o, func() {}
	}
	bar := progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(c.stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("msg"),
		progressbar.OptionThrottle(barThrottle),
		progressbar.OptionFullWidth(),
		// No spinner goroutine: with an unknown length the bar would start
		// one that redraws until the bar is finished, which a scan that
		// read nothing never is, so it drew over what came next, and it
		// reads the bar's start time without its lock.
		progressbar.OptionSetSpinnerChangeInterval(0),
	)
	last := 0
	o.Scanned = func(n int) { last = n; _ = bar.Set(n) }
	return o, func() {
		if last > 0 { // the final count, which the throttle may have skipped
			bar.ChangeMax(last)
			_ = bar.Finish()
		}
		_ = bar.Exit()
		fmt.Fprintln(c.stderr)
	}
}

// withheldWhy says why a change chosen by a filter leaves the letters
// dlq.Summary.Withheld counts.
const withheldWhy = "dead letters the filter does not choose (or past -limit) hold their IDs too, and a change of an ID moves every letter holding it; change those IDs by ID to move all their letters"

// printDryRun prints the answer of a dry run; s is the preview's: Shared
// is how many of the letters counted share their ID with others, Withheld
// how many the change would leave, WithheldIDs (in r.Failed too) their IDs
// as the change would name them.
func (c *cli) printDryRun(r jsonChange, first []*sdk.Message, verb string, missing []string, s dlq.Summary) error {
	shared, withheld := s.Shared, s.Withheld
	if c.json {
		for _, m := range first {
			r.Messages = append(r.Messages, dlq.View(m))
		}
		if err := writeJSON(c.stdout, r); err != nil {
			return err
		}
	} else {
		if len(first) > 0 {
			printTable(c.stdout, first)
			if r.Matched-withheld > len(first) {
				fmt.Fprintf(c.stdout, "… and %d more\n", r.Matched-withheld-len(first))
			}
		}
		n := fmt.Sprint(r.Matched - withheld)
		if !r.Complete {
			n = "at least " + n
		}
		fmt.Fprintf(c.stdout, "dry run: would %s %s dead letter(s) of %s; nothing changed\n", verb, n, esc(r.Queue))
		if shared > 0 {
			fmt.Fprintf(c.stdout, "%d of them share their ID with other dead letters: each ID changes every letter holding it\n", shared)
		}
		if withheld > 0 {
			fmt.Fprintf(c.stdout, "%d more match, but would be left: %s\n", withheld, withheldWhy)
			for _, fl := range s.WithheldIDs {
				fmt.Fprintf(c.stdout, "would not %s: %s: %s\n", verb, esc(fl.ID), errText(fl.Err))
			}
			if len(s.WithheldIDs) == dlq.MaxFailures {
				fmt.Fprintf(c.stdout, "(at most the first %d IDs left are named)\n", dlq.MaxFailures)
			}
		}
		if r.Incomplete != "" {
			fmt.Fprintf(c.stdout, "the scan stopped before the end of the dead-letter queue: %s\n", esc(r.Incomplete))
		}
		c.printMissing(r.Queue, missing)
	}
	if r.Incomplete != "" {
		// As dlq list: a count from a capped scan is a lower bound, not the
		// answer, so it exits 4 (nor is "none of the first -scan-limit
		// matched" a "nothing matched").
		return &partialError{msg: fmt.Sprintf("the dry run is partial: the scan stopped before the end of the dead-letter queue of %s, "+
			"so more than %d may match; raise -scan-limit (it was %d) or narrow the filter to count them all", esc(r.Queue), r.Matched, c.scanLimit)}
	}
	if r.Matched == 0 {
		return fmt.Errorf("no dead letter of %s matches: %w", esc(r.Queue), errNothing)
	}
	if len(missing) > 0 {
		// The change would exit 4 for them: a dry run answers as it would,
		// so that a script can check before it changes anything.
		return &partialError{msg: fmt.Sprintf("the dry run found %d of the named IDs not among the dead letters of %s (listed above): the change would not %s them", len(missing), esc(r.Queue), verb)}
	}
	if withheld > 0 {
		// As for missing IDs: the change would exit 4.
		return &partialError{msg: fmt.Sprintf("the dry run found %d matching dead letter(s) of %s that the change would not %s (above)", withheld, esc(r.Queue), verb)}
	}
	return nil
}
