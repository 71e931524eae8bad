package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/sdk"
)

// redeliveryWindow is the longest a job may come back after its first
// attempt: Options.RedeliveryWindow, else the queue retention given, plus
// the Worker's retry delays.
func (o Options) redeliveryWindow() time.Duration {
	w := o.RedeliveryWindow
	if w <= 0 {
		w = defaultQueueRetention
	}
	b := sdk.DefaultBackoff // the Worker's default backoff, its jitter at the most
	for a := 1; a < o.MaxAttempts; a++ {
		w += b.Delay(a, 0.999)
	}
	return w
}

// defaultQueueRetention is SQS's default MessageRetentionPeriod (4 days),
// the redelivery window assumed when none is given.
const defaultQueueRetention = 4 * 24 * time.Hour

// Idempotency runs the checks of an idempotency result store in PostgreSQL
// (package idempotency/pgstore; table is "schema.table", default
// "public.job_results"): idempotency.results-missing,
// idempotency.retention (results kept at least the redelivery window:
// Options.RedeliveryWindow plus the Worker's retry delays) and
// idempotency.claims-stuck (lease-mode claims in progress long past their
// lease). The scans of the retention and stuck-claims checks are bounded:
// one cut at its statement_timeout (scanBudget: a third of
// Options.CheckTimeout, at most half the time left before ctx's deadline)
// is reported as an Info finding, not checked.
func Idempotency(ctx context.Context, pool *pgxpool.Pool, table string, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	if table == "" {
		table = "public.job_results"
	}
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		schema, name = "public", table
	}
	qt := pgx.Identifier{schema, name}.Sanitize()
	var fs []Finding
	add := func(f Finding) { f.Queue = table; fs = append(fs, f) }
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, qt).Scan(&exists); err != nil {
		return nil, fmt.Errorf("doctor: idempotency: %w", err)
	}
	if !exists {
		add(Finding{ID: "idempotency.results-missing", Severity: Info, Summary: "no idempotency result table here: not checked",
			Evidence: "no table " + table, Fix: "point -results-table at the table idempotency/pgstore uses (Options.Schema, Table)"})
		return fs, nil
	}
	window := o.redeliveryWindow()
	var n int64
	var minKeep, maxKeep *time.Duration
	// Each row's retention is computed from the epochs and clamped to the
	// longest Duration, either way: an expires_at of 'infinity' or the
	// year 9999 (results kept forever, set by hand), from which a
	// timestamp cannot be subtracted or whose interval no Duration holds,
	// must neither fail the check nor wrap.
	// No index serves completed_at: the sample sorts every completed row.
	// The scan is bounded (boundedScan, scanBudget): on a table too large
	// to sort in time it is cut, and an Info finding says so, instead of
	// the whole check running out of time.
	var minUS, maxUS *int64
	err := boundedScan(ctx, pool, scanBudget(ctx, o), func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*), min(keep), max(keep)
		FROM (SELECT least(greatest((extract(epoch FROM expires_at) - extract(epoch FROM completed_at)) * 1e6, -$1::bigint), $1::bigint)::bigint AS keep
			FROM `+qt+` WHERE status = 'completed' AND completed_at IS NOT NULL AND isfinite(completed_at)
			ORDER BY completed_at DESC LIMIT 1000) r`, maxAgeMicros).Scan(&n, &minUS, &maxUS)
	})
	var cut *scanCut
	if err != nil && !errors.As(err, &cut) {
		return nil, fmt.Errorf("doctor: idempotency: retention: %w", err)
	}
	if minUS != nil && maxUS != nil {
		lo, hi := time.Duration(*minUS)*time.Microsecond, time.Duration(*maxUS)*time.Microsecond
		minKeep, maxKeep = &lo, &hi
	}
	switch {
	case cut != nil:
		add(Finding{ID: "idempotency.retention", Severity: Info, Summary: "retention not checked: the scan of the latest results was cut",
			Evidence: cutEvidence("the scan of the latest completed results (sorted by completed_at, which no index serves)", cut),
			Fix:      "run doctor off-peak with a larger -check-timeout; meanwhile compare idempotency.Options.Retention with the redelivery window " + window.Round(time.Hour).String()})
	case n == 0 || minKeep == nil:
		add(Finding{ID: "idempotency.retention", Severity: Info, Summary: "no completed result yet: retention not measurable",
			Evidence: "0 completed rows", Fix: "run again once jobs completed"})
	case *minKeep < window:
		add(Finding{ID: "idempotency.retention", Severity: Error, Summary: "results expire before a job can come back: a late redelivery or a redrive runs its effect again",
			Evidence: fmt.Sprintf("recent results kept %s to %s (of %d); redelivery window %s (queue retention %s + the retry delays of %d attempts)",
				minKeep.Round(time.Second), maxKeep.Round(time.Second), n, window.Round(time.Second), retentionOr(o.RedeliveryWindow), o.MaxAttempts),
			Fix: fmt.Sprintf("set idempotency.Options.Retention to at least %s (and redrive dead letters only within it)", window.Round(time.Hour)+time.Hour)})
	default:
		add(Finding{ID: "idempotency.retention", Severity: OK, Summary: "results outlive the redelivery window",
			Evidence: fmt.Sprintf("recent results kept at least %s ≥ window %s", minKeep.Round(time.Second), window.Round(time.Second))})
	}

	var stuck int64
	var oldest pgtype.Timestamptz // '-infinity' when a claim's lease was set so by hand
	// No index serves status or locked_until: the count reads every row.
	// Bounded as the retention scan is.
	err = boundedScan(ctx, pool, scanBudget(ctx, o), func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*), min(locked_until) FROM `+qt+`
		WHERE status = 'in_progress' AND locked_until < now() - $1 * interval '1 microsecond'`, o.StuckClaims.Microseconds()).Scan(&stuck, &oldest)
	})
	cut = nil
	if err != nil && !errors.As(err, &cut) {
		return nil, fmt.Errorf("doctor: idempotency: claims: %w", err)
	}
	switch {
	case cut != nil:
		add(Finding{ID: "idempotency.claims-stuck", Severity: Info, Summary: "stuck claims not checked: the scan of the claims in progress was cut",
			Evidence: cutEvidence("the count of claims in progress past their lease (by status and locked_until, which no index serves)", cut),
			Fix:      "run doctor off-peak with a larger -check-timeout"})
	case stuck > 0:
		add(Finding{ID: "idempotency.claims-stuck", Severity: Warn, Summary: "claims in progress long past their lease: their jobs never came back to take them over",
			Evidence: fmt.Sprintf("%s in_progress with locked_until more than %s ago, the oldest %s", plural(stuck, "claim", "claims"), o.StuckClaims, whenTS(oldest)),
			Fix:      "find their jobs (berth job show KEY): dead-lettered or lost with the effect perhaps half done; check the effect, then delete the claim row or redrive the job"})
	default:
		add(Finding{ID: "idempotency.claims-stuck", Severity: OK, Summary: "no claim is stuck in progress", Evidence: "threshold " + o.StuckClaims.String()})
	}
	return fs, nil
}

// The bounds of the dedupe check's scan (see [Dedupe]); variables so that
// tests can lower them.
var (
	// dedupeSample is how many keys under the prefix the check samples.
	dedupeSample = 200
	// dedupeScanCalls bounds the SCAN calls made to find them.
	dedupeScanCalls = 1000
	// dedupeScanCount is each SCAN call's COUNT.
	dedupeScanCount = int64(100)
)

func retentionOr(d time.Duration) string {
	if d <= 0 {
		return defaultQueueRetention.String() + " assumed"
	}
	return d.String()
}

// Dedupe runs the Redis dedupe cache check (idempotency/redisstore, keys
// under prefix, default "berth:idem:"), idempotency.dedupe-ttl: a sample of
// keys must carry a TTL (the cache must not grow forever); a TTL shorter
// than the redelivery window is reported as info (the cache is a fast path:
// the result store decides, so a miss costs a query, never a duplicate).
//
// The sample is the first 200 keys under prefix that SCAN finds (on a
// cluster or a ring, on each master or shard in turn, with a cursor of its
// own), within at most 1000 SCAN calls in all (COUNT 100: about 100,000 keys of the whole
// keyspace examined, whatever their prefix), so that a large Redis gets a
// result, not a check timeout. When the scan stops there, the finding says
// so: what it found is a sample ("at least" that many dedupe keys; none
// found is not none there), and its severity is that of the sample.
func Dedupe(ctx context.Context, rdb redis.UniversalClient, prefix string, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	if prefix == "" {
		prefix = redisstore.DefaultPrefix
	}
	window := o.redeliveryWindow()
	nodes, err := scanNodes(ctx, rdb)
	if err != nil {
		return nil, redisErr(rdb, err)
	}
	var keys []string
	var owners []redis.Cmdable // the node each key was found on
	calls, done := 0, 0
	for _, n := range nodes {
		var cursor uint64
		for len(keys) < dedupeSample && calls < dedupeScanCalls {
			page, next, err := n.Scan(ctx, cursor, prefix+"*", dedupeScanCount).Result()
			if err != nil {
				return nil, redisErr(rdb, err)
			}
			calls++
			keys = append(keys, page...)
			for range page {
				owners = append(owners, n)
			}
			if cursor = next; cursor == 0 {
				done++
				break
			}
		}
	}
	complete := done == len(nodes)
	keys = keys[:min(len(keys), dedupeSample)]
	// stopped says where a scan that did not reach the end of the keyspace
	// stopped; only a scan that found too few keys to fill the sample says
	// it (a full sample is a sample whatever the keyspace holds).
	stopped := ""
	if !complete && len(keys) < dedupeSample {
		stopped = fmt.Sprintf("SCAN stopped after %d calls (COUNT %d, about %d keys of the keyspace examined) before the end of the keyspace", calls, dedupeScanCount, int64(calls)*dedupeScanCount)
	}
	f := Finding{ID: "idempotency.dedupe-ttl", Queue: prefix + "*"}
	if len(keys) == 0 {
		f.Severity, f.Summary, f.Evidence, f.Fix = Info, "no dedupe key in Redis: nothing to check", "SCAN "+prefix+"*: none", "run again once jobs completed"
		if stopped != "" {
			f.Summary = "no dedupe key found in the part of Redis scanned: nothing checked"
			f.Evidence = "SCAN " + prefix + "*: none; " + stopped
			f.Fix = "run again once jobs completed; on a Redis holding many other keys, check a sample of " + prefix + "* by hand (redis-cli --scan --pattern '" + prefix + "*' | head, then PTTL)"
		}
		return []Finding{f}, nil
	}
	var forever int
	var longest time.Duration
	for i, k := range keys {
		d, err := owners[i].PTTL(ctx, k).Result()
		if err != nil {
			return nil, redisErr(rdb, err)
		}
		switch {
		case d == -1 || d < -2: // no expiry
			forever++
		case d > longest:
			longest = d
		}
	}
	ev := fmt.Sprintf("%d keys sampled: %d without a TTL, the longest remaining TTL %s; redelivery window %s", len(keys), forever, longest.Round(time.Second), window.Round(time.Second))
	if stopped != "" {
		ev = fmt.Sprintf("at least %d dedupe keys, %d sampled: %d without a TTL, the longest remaining TTL %s; redelivery window %s; %s", len(keys), len(keys), forever, longest.Round(time.Second), window.Round(time.Second), stopped)
	}
	switch {
	case forever > 0:
		f.Severity, f.Summary, f.Fix = Warn, "dedupe keys without a TTL: the cache grows forever", "set idempotency.Options.CacheTTL (default: Retention), or EXPIRE the keys"
	case longest < window:
		f.Severity, f.Summary, f.Fix = Info, "the dedupe TTL is shorter than the redelivery window: later duplicates are caught by the result store (a query), not the cache", "raise CacheTTL to the window if those queries matter; correctness does not depend on it"
	default:
		f.Severity, f.Summary = OK, "dedupe keys expire, and outlive the redelivery window"
	}
	f.Evidence = ev
	return []Finding{f}, nil
}

// scanNodes returns the clients whose keyspaces SCAN reads, one cursor
// each: every master of a cluster, every shard of a ring (go-redis sends a
// SCAN made on either to the one node its cursor hashes to), rdb itself
// otherwise.
func scanNodes(ctx context.Context, rdb redis.UniversalClient) ([]redis.Cmdable, error) {
	var (
		mu    sync.Mutex
		nodes []redis.Cmdable
	)
	add := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, c)
		return nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, add); err != nil {
			return nil, err
		}
	case *redis.Ring:
		if err := c.ForEachShard(ctx, add); err != nil {
			return nil, err
		}
	default:
		return []redis.Cmdable{rdb}, nil
	}
	return nodes, nil
}

// redisErr wraps err, from a call on rdb. A timeout of the client's own
// (its read, write or dial timeout, not the context's deadline) is wrapped
// in a [clientTimeout] naming which and how long, when rdb says: go-redis
// returns a read's timeout as a bare "i/o timeout", without the call.
func redisErr(rdb redis.UniversalClient, err error) error {
	err = fmt.Errorf("doctor: redis: %w", err)
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		return err
	}
	var dial, read, write time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		dial, read, write = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient:
		o := c.Options()
		dial, read, write = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	case *redis.Ring:
		o := c.Options()
		dial, read, write = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	default:
		return err
	}
	ct := &clientTimeout{err: err}
	var op *net.OpError
	call := ""
	if errors.As(err, &op) {
		call = op.Op
	}
	switch {
	case call == "dial" && dial > 0:
		ct.name, ct.figure = "Redis client's dial timeout", dial.String()
	case call == "write" && write > 0:
		ct.name, ct.figure = "Redis client's write timeout", write.String()
	case call == "read" && read > 0, call == "" && read > 0 && (write <= 0 || write == read):
		ct.name, ct.figure = "Redis client's read timeout", read.String()
	case call == "" && read > 0:
		ct.name, ct.figure = "Redis client's read or write timeout", read.String()+" or "+write.String()
	default:
		return err
	}
	return ct
}
