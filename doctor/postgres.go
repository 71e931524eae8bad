package doctor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/internal/pgindex"
	"github.com/berthq/berth/sdk"
)

// pgTarget is a PostgreSQL broker's pool and schema.
type pgTarget struct {
	pool   *pgxpool.Pool
	schema string
	broker *postgres.Broker
}

func asPostgres(b sdk.Broker) *pgTarget {
	var pb *postgres.Broker
	if as, ok := b.(interface{ As(any) bool }); ok && as.As(&pb) {
		return &pgTarget{pool: pb.Pool(), schema: pb.Schema(), broker: pb}
	}
	if pb, ok := b.(*postgres.Broker); ok {
		return &pgTarget{pool: pb.Pool(), schema: pb.Schema(), broker: pb}
	}
	return nil
}

// Postgres runs the PostgreSQL job-table checks on schema's jobs table
// (postgres.table-missing, postgres.indexes, postgres.autovacuum-server,
// postgres.autovacuum,
// postgres.dead-tuples, postgres.stuck-processing, postgres.oldest-ready,
// postgres.max-attempts, postgres.queue-unknown) and the clock check (clock.skew). Lease is the
// broker's lease (0: 30s).
func Postgres(ctx context.Context, pool *pgxpool.Pool, schema string, lease time.Duration, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	fs, err := postgresChecks(ctx, pool, schema, lease, o)
	Sort(fs)
	return fs, err
}

// postgresChecks runs pgChecks within o.CheckTimeout.
func postgresChecks(ctx context.Context, pool *pgxpool.Pool, schema string, lease time.Duration, o Options) ([]Finding, error) {
	return bounded(ctx, o, "PostgreSQL job table checks", schema+".jobs", func(ctx context.Context) ([]Finding, error) {
		return pgChecks(ctx, pool, schema, lease, o)
	})
}

// indexCosts are what the absence of each index of the jobs table
// (postgres.Indexes, from brokers/postgres/schema.sql) costs, and its
// severity. An index schema.sql gains without an entry here is checked all
// the same, as a Warn.
var indexCosts = map[string]struct {
	severity Severity
	cost     string
}{
	"jobs_claim_idx":            {Error, "every claim scans the whole table"},
	"jobs_dead_letter_idx":      {Warn, "listing and redriving dead letters scans the whole table"},
	"jobs_completed_idx":        {Warn, "retention of completed rows scans the whole table"},
	"jobs_dead_letter_page_idx": {Warn, "every dead-letter page sorts all of its queue's dead letters"},
	"jobs_dedupe_idx":           {Error, "enqueue dedupe (DedupeEnqueue) fails: ON CONFLICT has no unique index of its columns and predicate"},
}

// pgIndexes is the postgres.indexes finding of table (qt quoted, in
// schema): the indexes of schema.sql present, valid and with its
// definition, each classified by classifyIndex (as the ledger's are). A
// missing or invalid index has its own severity (indexCosts), as has one
// whose name another relation of the schema holds; one defined otherwise
// is a Warn, but for a unique one (jobs_dedupe_idx), which ON CONFLICT
// cannot use unless it is exactly that; one a CREATE INDEX CONCURRENTLY
// under way builds, or its replacement, is Info, with nothing to run; a
// replacement left beside a right index (the same index again, or invalid)
// is a Warn, its fix a DROP of the replacement. When
// the indexes cannot be read it is an Info finding that says why; where
// only the progress view cannot be read, an invalid index may be a build
// under way: the evidence says so and the fix warns before its DROP. A
// timeout or an interrupt is returned, as the check's other queries would
// meet it too.
func pgIndexes(ctx context.Context, pool *pgxpool.Pool, schema, table, qt string) (Finding, error) {
	ixs := postgres.Indexes()
	names := make([]string, len(ixs))
	for i, ix := range ixs {
		names[i] = ix.Name
	}
	cat, err := pgindex.Read(ctx, pool, qt, names)
	switch {
	case err != nil && (errors.Is(ctx.Err(), context.Canceled) || timedOut(ctx, err)):
		return Finding{}, fmt.Errorf("doctor: postgres: indexes: %w", err)
	case err != nil:
		return Finding{ID: "postgres.indexes", Severity: Info, Queue: table, Summary: "the indexes of the jobs table could not be read: not checked",
			Evidence: err.Error(), Fix: "let doctor's database user read the catalog (pg_index, pg_get_indexdef) and the table, then run doctor again"}, nil
	}
	worst := OK
	var bad []string
	var vs []indexVerdict
	for _, ix := range ixs {
		c, ok := indexCosts[ix.Name]
		if !ok {
			c.severity, c.cost = Warn, "the queries it serves scan the whole table"
		}
		st := cat.State(ix.Name, ix.Matches)
		v := classifyIndex(indexSpec{name: ix.Name, cost: c.cost, source: "schema.sql", want: ix.Def, unique: ix.Unique,
			create: ix.Create(schema), drop: ix.Drop(schema), replace: ix.Replace(schema),
			rename: pgindex.Rename(schema, ix.Name, st.RenameTo), renameNew: pgindex.Rename(schema, ix.Name+pgindex.NewSuffix, st.NewTo)},
			st)
		if v.ok {
			continue
		}
		// Its own severity, but Info while a build under way builds it,
		// and a Warn when defined otherwise, unless unique (ON CONFLICT
		// cannot use it unless it is exactly that).
		sev := c.severity
		switch {
		case v.building:
			sev = Info
		case v.otherwise && !ix.Unique, v.leftover:
			sev = Warn
		}
		if sev.rank() > worst.rank() {
			worst = sev
		}
		bad = append(bad, v.evidence)
		vs = append(vs, v)
	}
	if len(bad) == 0 {
		return Finding{ID: "postgres.indexes", Severity: OK, Queue: table, Summary: "every index of the jobs table is present, as schema.sql creates it",
			Evidence: fmt.Sprintf("%d indexes, none missing, invalid or defined otherwise", len(ixs))}, nil
	}
	return Finding{ID: "postgres.indexes", Severity: worst, Queue: table, Summary: "indexes of the jobs table are missing, invalid or not as schema.sql creates them",
		Evidence: strings.Join(bad, "; "), Fix: indexFix(vs, "writes to the jobs table", "the broker's Migrate")}, nil
}

func pgChecks(ctx context.Context, pool *pgxpool.Pool, schema string, lease time.Duration, o Options) ([]Finding, error) {
	if lease <= 0 {
		lease = 30 * time.Second
	}
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	var fs []Finding
	add := func(f Finding) { fs = append(fs, f) }

	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, qt).Scan(&exists); err != nil {
		return nil, fmt.Errorf("doctor: postgres: %w", err)
	}
	if !exists {
		add(Finding{ID: "postgres.table-missing", Severity: Error, Queue: table, Summary: "the jobs table does not exist",
			Evidence: fmt.Sprintf("no table %s", table), Fix: "run the broker's Migrate (brokerurl: ?migrate=true) or apply brokers/postgres/schema.sql"})
		return append(fs, clockSkew(ctx, pool, o)...), nil
	}

	// Indexes.
	f, err := pgIndexes(ctx, pool, schema, table, qt)
	if err != nil {
		return nil, err
	}
	add(f)

	// Autovacuum, globally and on the table.
	// Autovacuum acts on the dead tuples the server counts only with
	// track_counts on (a server setting, or one of the database's): off,
	// it never vacuums, and n_dead_tup stays 0 however bloated the table.
	var global, counts string
	var relopts []string
	if err := pool.QueryRow(ctx, `SELECT current_setting('autovacuum'), current_setting('track_counts'), COALESCE(c.reloptions, '{}')
		FROM pg_class c WHERE c.oid = $1::regclass`, qt).Scan(&global, &counts, &relopts); err != nil {
		return nil, fmt.Errorf("doctor: postgres: autovacuum: %w", err)
	}
	tableOff := false
	for _, r := range relopts {
		if k, v, ok := strings.Cut(r, "="); ok && strings.EqualFold(k, "autovacuum_enabled") && pgFalse(v) {
			tableOff = true
		}
	}
	settings := "autovacuum = " + global + ", track_counts = " + counts
	switch {
	case global != "on":
		add(Finding{ID: "postgres.autovacuum-server", Severity: Error, Queue: table, Summary: "autovacuum is off on the server",
			Evidence: settings, Fix: "set autovacuum = on (postgresql.conf, ALTER SYSTEM): every settled job leaves a dead tuple the claim query must skip; until then VACUUM the jobs table from cron"})
	case counts != "on":
		add(Finding{ID: "postgres.autovacuum-server", Severity: Error, Queue: table, Summary: "track_counts is off: autovacuum has no dead-tuple counts to act on and never vacuums the jobs table",
			Evidence: settings, Fix: "set track_counts = on (postgresql.conf, ALTER SYSTEM; and ALTER DATABASE ... RESET track_counts where a database sets it): every settled job leaves a dead tuple the claim query must skip; until then VACUUM the jobs table from cron"})
	default:
		add(Finding{ID: "postgres.autovacuum-server", Severity: OK, Queue: table, Summary: "autovacuum is on on the server", Evidence: settings})
	}
	if tableOff {
		add(Finding{ID: "postgres.autovacuum", Severity: Error, Queue: table, Summary: "autovacuum is off for the jobs table",
			Evidence: "reloptions " + strings.Join(relopts, ","), Fix: fmt.Sprintf("ALTER TABLE %s RESET (autovacuum_enabled)", qt)})
	} else {
		add(Finding{ID: "postgres.autovacuum", Severity: OK, Queue: table, Summary: "autovacuum is not disabled for the jobs table",
			Evidence: "reloptions " + strings.Join(relopts, ",") + "; server autovacuum = " + global})
	}

	// Dead tuples.
	var live, dead int64
	var lastAuto, lastManual *time.Time
	if err := pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum
		FROM pg_stat_user_tables WHERE relid = $1::regclass`, qt).Scan(&live, &dead, &lastAuto, &lastManual); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("doctor: postgres: dead tuples: %w", err)
	}
	ev := fmt.Sprintf("%d live, %d dead tuples; last autovacuum %s, last vacuum %s", live, dead, when(lastAuto), when(lastManual))
	switch {
	case counts != "on":
		add(Finding{ID: "postgres.dead-tuples", Severity: Info, Queue: table, Summary: "dead tuples are not counted (track_counts off): not measurable",
			Evidence: ev + "; track_counts = " + counts, Fix: "set track_counts = on (see postgres.autovacuum-server); meanwhile pgstattuple tells the table's dead tuples"})
	case dead > o.DeadTuples && dead*5 > live+dead:
		add(Finding{ID: "postgres.dead-tuples", Severity: Warn, Queue: table, Summary: "the jobs table is bloated with dead tuples",
			Evidence: ev, Fix: fmt.Sprintf("VACUUM (ANALYZE) %s; make autovacuum keep up: lower autovacuum_vacuum_scale_factor for the table (e.g. 0.01) and delete completed rows (Options.Retention)", qt)})
	default:
		add(Finding{ID: "postgres.dead-tuples", Severity: OK, Queue: table, Summary: "dead tuples are under control", Evidence: ev})
	}

	// Per queue: stuck processing rows, oldest ready job, max_attempts.
	want := map[string]bool{}
	for _, q := range o.Queues {
		want[q] = true
	}
	rows, err := pool.Query(ctx, `SELECT queue,
			count(*) FILTER (WHERE status = 'processing' AND visibility_until < now() - $1 * interval '1 microsecond'),
			min(visibility_until) FILTER (WHERE status = 'processing' AND visibility_until < now() - $1 * interval '1 microsecond'),
			(extract(epoch FROM now() - min(greatest(available_at, now() - $3 * interval '1 microsecond'))
				FILTER (WHERE status IN ('queued', 'retry') AND available_at <= now())) * 1e6)::bigint,
			min(max_attempts) FILTER (WHERE status IN ('queued', 'retry', 'processing')),
			count(*) FILTER (WHERE status IN ('queued', 'retry', 'processing') AND max_attempts < $2)
		FROM `+qt+` WHERE status IN ('queued', 'retry', 'processing') GROUP BY queue ORDER BY queue`,
		lease.Microseconds(), o.MaxAttempts, maxAgeMicros)
	if err != nil {
		return nil, fmt.Errorf("doctor: postgres: queues: %w", err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var (
			q             string
			stuck         int64
			stuckSince    pgtype.Timestamptz
			oldestUS      *int64
			minAttempts   *int32
			belowAttempts int64
		)
		if err := rows.Scan(&q, &stuck, &stuckSince, &oldestUS, &minAttempts, &belowAttempts); err != nil {
			rows.Close()
			return nil, err
		}
		if len(want) > 0 && !want[q] {
			continue
		}
		seen[q] = true
		if oldestUS != nil {
			// Clamped again: the interval arithmetic may round up by 1 µs.
			*oldestUS = min(*oldestUS, maxAgeMicros)
		}
		if stuck > 0 {
			add(Finding{ID: "postgres.stuck-processing", Severity: Warn, Queue: q, Summary: "jobs are processing past their lease and nobody reclaims them",
				Evidence: fmt.Sprintf("%s with status processing and visibility_until more than a lease (%s) ago, the oldest since %s", plural(stuck, "row", "rows"), lease, whenTS(stuckSince)),
				Fix:      "start a Worker on this queue (a claim reclaims expired leases); if Workers run, check they consume this queue and schema"})
		} else {
			add(Finding{ID: "postgres.stuck-processing", Severity: OK, Queue: q, Summary: "no job is processing past its lease", Evidence: "lease " + lease.String()})
		}
		if oldestUS != nil && time.Duration(*oldestUS)*time.Microsecond > o.OldestReady {
			age := (time.Duration(*oldestUS) * time.Microsecond).Round(time.Second)
			add(Finding{ID: "postgres.oldest-ready", Severity: Warn, Queue: q, Summary: "a ready job has waited too long",
				Evidence: fmt.Sprintf("the oldest ready job has been due for %s (threshold %s)", age, o.OldestReady),
				Fix:      "add Workers or Concurrency, or find what holds them (berth stats, handler durations)"})
		} else {
			age := "no ready job"
			if oldestUS != nil {
				age = fmt.Sprintf("oldest ready job due for %s", (time.Duration(*oldestUS) * time.Microsecond).Round(time.Millisecond))
			}
			add(Finding{ID: "postgres.oldest-ready", Severity: OK, Queue: q, Summary: "ready jobs are taken in time", Evidence: age})
		}
		if belowAttempts > 0 && minAttempts != nil {
			add(Finding{ID: "postgres.max-attempts", Severity: Error, Queue: q, Summary: "jobs' max_attempts is below the Worker's MaxAttempts",
				Evidence: fmt.Sprintf("%s with max_attempts < %d (lowest %d): the broker dead-letters them before the Worker's last attempt", plural(belowAttempts, "job", "jobs"), o.MaxAttempts, *minAttempts),
				Fix:      fmt.Sprintf("publish with the broker's MaxAttempts (URL max_attempts) at least %d, or lower the Workers' MaxAttempts; UPDATE the waiting rows' max_attempts", o.MaxAttempts)})
		} else if minAttempts != nil {
			add(Finding{ID: "postgres.max-attempts", Severity: OK, Queue: q, Summary: "jobs' max_attempts fits the Worker's MaxAttempts",
				Evidence: fmt.Sprintf("lowest max_attempts %d, MaxAttempts %d", *minAttempts, o.MaxAttempts)})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var idle []string
	for _, q := range o.Queues {
		if !seen[q] {
			idle = append(idle, q)
		}
	}
	if len(idle) > 0 {
		unknown, err := unknownQueues(ctx, pool, schema, qt, idle, o)
		if err != nil {
			return nil, err
		}
		fs = append(fs, unknown...)
	}
	return append(fs, clockSkew(ctx, pool, o)...), nil
}

// unknownQueues reports each of idle, queues named in Options.Queues with no
// waiting or running job. A queue declared with DeclareQueue (a row of the
// schema's queues table, which Stats also counts as an existing queue) or
// with rows in another status (completed, dead-lettered) is idle: OK. A
// queue with neither is either one nothing has published to yet or a
// misspelt name, which a Worker would poll forever without an error.
// postgres.queue-unknown says so: Warn when a queue that has rows is a few
// edits away (the likely misspelling), Info otherwise. Unless every idle
// queue is declared, it reads the distinct queue names once, as
// Broker.Queues does (a scan of the jobs table). That scan is bounded
// (boundedScan, scanBudget): on a table too large to scan in time it is
// cut, and each idle queue gets an Info finding saying it was not checked,
// instead of the whole check running out of time.
func unknownQueues(ctx context.Context, pool *pgxpool.Pool, schema, qt string, idle []string, o Options) ([]Finding, error) {
	declared, err := declaredQueues(ctx, pool, schema, idle)
	if err != nil {
		return nil, err
	}
	var fs []Finding
	var rest []string
	for _, q := range idle {
		if declared[q] {
			fs = append(fs, Finding{ID: "postgres.oldest-ready", Severity: OK, Queue: q, Summary: "no waiting or running job",
				Evidence: "no queued, retry or processing row; the queue is declared (DeclareQueue)"})
		} else {
			rest = append(rest, q)
		}
	}
	if len(rest) == 0 {
		return fs, nil
	}
	idle = rest
	var known []string
	err = boundedScan(ctx, pool, scanBudget(ctx, o), func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT DISTINCT queue FROM `+qt+` ORDER BY queue`)
		if err != nil {
			return err
		}
		known, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	var c *scanCut
	if errors.As(err, &c) {
		for _, q := range idle {
			fs = append(fs, Finding{ID: "postgres.queue-unknown", Severity: Info, Queue: q,
				Summary:  "no waiting or running job; whether this queue ever had rows (or its name is misspelt) was not checked: the scan of the queue names was cut",
				Evidence: cutEvidence("the scan of the jobs table's queue names (SELECT DISTINCT queue)", c),
				Fix:      "nothing is known to be wrong; to check the name, compare it with the queues the publishers use, or run doctor off-peak with a larger -check-timeout"})
		}
		return fs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("doctor: postgres: queue names: %w", err)
	}
	has := make(map[string]bool, len(known))
	for _, k := range known {
		has[k] = true
	}
	for _, q := range idle {
		if has[q] {
			fs = append(fs, Finding{ID: "postgres.oldest-ready", Severity: OK, Queue: q, Summary: "no waiting or running job",
				Evidence: "no queued, retry or processing row; completed or dead-lettered rows only"})
			continue
		}
		ev := "no row of this queue in any status"
		if len(known) == 0 {
			ev += "; the jobs table is empty"
		} else {
			ev += "; queues with rows: " + nameList(known, 10)
		}
		f := Finding{ID: "postgres.queue-unknown", Severity: Info, Queue: q,
			Summary:  "no job of this queue was ever stored (or none is kept): a new queue, or a misspelt name",
			Evidence: ev,
			Fix:      "if nothing has published to this queue yet, nothing is wrong; else check the queue name the Workers and publishers use"}
		if near := nearest(q, known); near != "" {
			f.Severity = Warn
			f.Summary = fmt.Sprintf("no job of this queue was ever stored, and queue %s has rows: a misspelt name?", quoted(near))
			f.Fix = fmt.Sprintf("if you meant %s, correct the queue name of the Workers and publishers that use %s", quoted(near), quoted(q))
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// declaredQueues returns which of names the schema's queues table
// (DeclareQueue's) holds; none when the table does not exist (a schema
// migrated before it was added).
func declaredQueues(ctx context.Context, pool *pgxpool.Pool, schema string, names []string) (map[string]bool, error) {
	tq := pgx.Identifier{schema, "queues"}.Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tq).Scan(&exists); err != nil {
		return nil, fmt.Errorf("doctor: postgres: declared queues: %w", err)
	}
	out := map[string]bool{}
	if !exists {
		return out, nil
	}
	rows, err := pool.Query(ctx, `SELECT name FROM `+tq+` WHERE name = ANY($1)`, names)
	if err != nil {
		return nil, fmt.Errorf("doctor: postgres: declared queues: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("doctor: postgres: declared queues: %w", err)
	}
	for _, n := range found {
		out[n] = true
	}
	return out, nil
}

// nameList quotes up to limit of names, saying how many more there are.
func nameList(names []string, limit int) string {
	var b strings.Builder
	for i, n := range names {
		if i == limit {
			fmt.Fprintf(&b, " and %d more", len(names)-limit)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quoted(n))
	}
	return b.String()
}

// nearest returns the name in names closest to q by edit distance when it
// is close enough to be a misspelling of it (at most 2 edits, and fewer
// than half of q's length), else "". Names are compared by rune; a long
// name is not compared, as a misspelling is never far longer than q.
func nearest(q string, names []string) string {
	qr := []rune(q)
	limit := min(2, (len(qr)-1)/2)
	best, bestD := "", limit+1
	for _, n := range names {
		nr := []rune(n)
		if d := len(nr) - len(qr); d > limit || -d > limit {
			continue
		}
		if d := editDistance(qr, nr); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b []rune) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// clockSkew compares the worker's clock with the database's, corrected by
// half the round trip.
func clockSkew(ctx context.Context, pool *pgxpool.Pool, o Options) []Finding {
	start := time.Now()
	var db time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
		return []Finding{{ID: "clock.skew", Severity: Info, Summary: "the database clock could not be read", Evidence: err.Error()}}
	}
	rtt := time.Since(start)
	local := o.Now().Add(-rtt / 2)
	skew := db.Sub(local)
	ev := fmt.Sprintf("database %s, worker %s (round trip %s): skew %s", db.UTC().Format(time.RFC3339Nano),
		local.UTC().Format(time.RFC3339Nano), rtt.Round(time.Microsecond), skew.Round(time.Millisecond))
	abs := max(skew, -skew)
	switch {
	case abs > 5*o.ClockSkew:
		return []Finding{{ID: "clock.skew", Severity: Error, Summary: "the worker's clock and the database's disagree", Evidence: ev,
			Fix: "run NTP (chrony, systemd-timesyncd) on both hosts: leases, delays and retention compare times across them"}}
	case abs > o.ClockSkew:
		return []Finding{{ID: "clock.skew", Severity: Warn, Summary: "the worker's clock drifts from the database's", Evidence: ev,
			Fix: "run NTP (chrony, systemd-timesyncd) on both hosts"}}
	}
	return []Finding{{ID: "clock.skew", Severity: OK, Summary: "the worker's clock agrees with the database's", Evidence: ev}}
}

// maxAgeMicros is the longest age, in microseconds, of the oldest ready job
// the queue checks report: the longest time.Duration. Each row's due time
// is clamped to now() minus it before it is subtracted from now(): a row
// due at '-infinity' (written by hand or by another tool), from which
// now() cannot be subtracted, must not fail the whole check, nor one due
// centuries ago overflow the Duration.
const maxAgeMicros = int64(math.MaxInt64 / time.Microsecond)

// whenTS is when for a timestamp that may be ±infinity.
func whenTS(t pgtype.Timestamptz) string {
	switch {
	case !t.Valid:
		return "never"
	case t.InfinityModifier == pgtype.Infinity:
		return "infinity"
	case t.InfinityModifier == pgtype.NegativeInfinity:
		return "-infinity"
	}
	return when(&t.Time)
}

func when(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// pgFalse reports whether v is a false boolean as PostgreSQL reads one
// (parse_bool): a reloption keeps the text it was given, and "0", "no",
// "f" or "OFF" switch autovacuum off as "false" does.
func pgFalse(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	switch {
	case v == "":
		return false
	case v == "0", v == "of", v == "off":
		return true
	case strings.HasPrefix("false", v), strings.HasPrefix("no", v):
		return true
	}
	return false
}
