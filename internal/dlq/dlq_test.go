package dlq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type broker interface {
	sdk.Broker
	sdk.Inspector
	sdk.DeadLetters
	dlq.Pager
	dlq.Deleter
	dlq.QueueLister
}

// brokers runs fn on a memory broker and on a PostgreSQL broker in a schema
// of its own.
func brokers(t *testing.T, fn func(t *testing.T, b broker)) {
	t.Run("memory", func(t *testing.T) {
		b, err := memory.New(memory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		fn(t, b)
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, PostgresBroker(t))
	})
}

// PostgresBroker returns a migrated PostgreSQL broker in a fresh schema.
func PostgresBroker(t *testing.T) *postgres.Broker {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("dlq_test_%d", rand.Uint64()%1e12)
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// seed dead-letters n messages on queue; every third is transient, the rest
// permanent; the reason names the message's number.
func seed(t *testing.T, b sdk.Broker, queue string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := 0; i < n; i++ {
		typ := "billing.charge"
		if i%2 == 1 {
			typ = "billing.refund"
		}
		if err := b.Publish(ctx, queue, &sdk.Message{Type: typ, Body: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	for len(ids) < n {
		ds, err := b.Receive(ctx, queue, min(100, n-len(ids)))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			var n int
			fmt.Sscanf(string(d.Message().Body), `{"n":%d}`, &n)
			cause := sdk.Permanent(fmt.Errorf("order %d missing", n))
			if n%3 == 0 {
				cause = fmt.Errorf("timeout %d", n)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, d.Message().ID)
		}
	}
	return ids
}

func TestPagesSeeEveryDeadLetterOnce(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		ids := seed(t, b, "billing", 23)
		seen := map[string]int{}
		cursor, pages := "", 0
		for {
			page, next, err := b.DeadLetterPage(ctx, "billing", cursor, 5)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, m := range page {
				seen[m.ID]++
				if m.Header(sdk.HeaderDeadLetterReason) == "" {
					t.Fatalf("no reason header on %s", m.ID)
				}
			}
			// Redriving what was seen does not move the cursor's position.
			if pages == 2 {
				if _, err := b.RedriveDeadLetters(ctx, "billing", page[0].ID, page[4].ID); err != nil {
					t.Fatal(err)
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if pages != 5 || len(seen) != len(ids) {
			t.Fatalf("%d pages, %d of %d seen", pages, len(seen), len(ids))
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("%s seen %d times", id, n)
			}
		}
		// A limit of "everything" (math.MaxInt) after a cursor gives the
		// rest (the two redriven above are gone), not an overflow of the
		// one-more-than-asked probe.
		first, cursor, err := b.DeadLetterPage(ctx, "billing", "", 5)
		if err != nil || len(first) != 5 || cursor == "" {
			t.Fatalf("first page: %d letters, cursor %q, %v", len(first), cursor, err)
		}
		rest, next, err := b.DeadLetterPage(ctx, "billing", cursor, math.MaxInt)
		if err != nil || len(rest) != len(ids)-2-5 || next != "" {
			t.Fatalf("the rest with limit MaxInt: %d letters, cursor %q, %v; want %d, \"\", nil", len(rest), next, err, len(ids)-2-5)
		}
		if _, _, err := b.DeadLetterPage(ctx, "billing", "not-a-cursor", 5); err == nil {
			t.Fatal("a made-up cursor was accepted")
		}
		qs, err := b.Queues(ctx)
		if err != nil || len(qs) != 1 || qs[0] != "billing" {
			t.Fatalf("queues %v %v", qs, err)
		}
	})
}

func TestDeleteDeadLetters(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		ids := seed(t, b, "billing", 3)
		if _, err := b.DeleteDeadLetters(ctx, "billing", ids[0], "no-such-id"); !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}
		if n, err := b.DeleteDeadLetters(ctx, "billing", ids[0], ids[2]); err != nil || n != 2 {
			t.Fatalf("delete: %d %v", n, err)
		}
		st, _ := b.Stats(ctx, "billing")
		if st.DeadLettered != 1 || st.Ready != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestFilter(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	m := &sdk.Message{ID: "a", Type: "billing.charge", Headers: map[string]string{
		sdk.HeaderDeadLetterClass:  "permanent",
		sdk.HeaderDeadLetterReason: "order o1 missing",
		sdk.HeaderLastFailure:      now.Add(-time.Hour).Format(time.RFC3339Nano),
	}}
	var re dlq.Filter
	if err := re.ParseReason("/o[0-9] miss/"); err != nil {
		t.Fatal(err)
	}
	var badRE dlq.Filter
	if err := badRE.ParseReason("/([/"); !errors.Is(err, dlq.ErrBadFilter) {
		t.Fatalf("bad regexp: %v", err)
	}
	for _, c := range []struct {
		f    dlq.Filter
		want bool
	}{
		{dlq.Filter{}, true},
		{dlq.Filter{IDs: []string{"b", "a"}}, true},
		{dlq.Filter{IDs: []string{"b"}}, false},
		{dlq.Filter{Types: []string{"billing.charge"}}, true},
		{dlq.Filter{Types: []string{"billing"}}, false},
		{dlq.Filter{Class: "permanent"}, true},
		{dlq.Filter{Class: "transient"}, false},
		{dlq.Filter{Reason: "o1"}, true},
		{dlq.Filter{Reason: "o2"}, false},
		{re, true},
		{dlq.Filter{ReasonRE: regexp.MustCompile(`^missing`)}, false},
		{dlq.Filter{OlderThan: 30 * time.Minute}, true},
		{dlq.Filter{OlderThan: 2 * time.Hour}, false},
		{dlq.Filter{NewerThan: 2 * time.Hour}, true},
		{dlq.Filter{NewerThan: 30 * time.Minute}, false},
	} {
		if got := c.f.Match(m, now); got != c.want {
			t.Errorf("%+v.Match = %v, want %v", c.f, got, c.want)
		}
	}
}

func TestApply(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		seed(t, b, "billing", 30)
		// Transient failures (10 of 30) are redriven, page by page.
		var progress []int
		r, err := dlq.Apply(ctx, b, "billing", dlq.Filter{Reason: "timeout"}, dlq.Redrive, dlq.Options{PageSize: 4}, func(n int) { progress = append(progress, n) })
		if err != nil || r.Done != 10 || r.Matched != 10 || r.Scanned != 30 || !r.Complete || r.Missed != 0 {
			t.Fatalf("redrive: %+v %v", r, err)
		}
		if len(progress) < 3 || progress[len(progress)-1] != 10 {
			t.Fatalf("progress %v", progress)
		}
		st, _ := b.Stats(ctx, "billing")
		if st.Ready != 10 || st.DeadLettered != 20 {
			t.Fatalf("stats after redrive %+v", st)
		}
		// -limit: delete 3 refunds.
		r, err = dlq.Apply(ctx, b, "billing", dlq.Filter{Types: []string{"billing.refund"}}, dlq.Delete, dlq.Options{PageSize: 4, Limit: 3}, nil)
		if err != nil || r.Done != 3 || r.Complete {
			t.Fatalf("delete: %+v %v", r, err)
		}
		st, _ = b.Stats(ctx, "billing")
		if st.Ready != 10 || st.DeadLettered != 17 {
			t.Fatalf("stats after delete %+v", st)
		}
	})
}

// A dead letter chosen by ID that is gone is a failure in the result, and
// the others are still done.
func TestApplyPartial(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		ids := seed(t, b, "billing", 4)
		// Delete one between the walk's read and the redrive of its page.
		gone := ids[1]
		racing := &racer{broker: b, gone: gone}
		r, err := dlq.Apply(ctx, racing, "billing", dlq.Filter{}, dlq.Redrive, dlq.Options{}, nil)
		if err != nil || r.Done != 3 || r.Missed != 1 || len(r.Failed) != 1 || r.Failed[0].ID != gone || !errors.Is(r.Failed[0].Err, sdk.ErrNotFound) {
			t.Fatalf("%+v %v", r, err)
		}
	})
}

// racer deletes one dead letter right after the first page is read, as a
// second operator would.
type racer struct {
	broker
	gone string
	done bool
}

func (r *racer) DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
	page, next, err := r.broker.DeadLetterPage(ctx, queue, cursor, limit)
	if err == nil && !r.done {
		r.done = true
		if _, err := r.broker.DeleteDeadLetters(ctx, queue, r.gone); err != nil {
			return nil, "", err
		}
	}
	return page, next, err
}

// An interrupted apply has done exactly what it counted.
func TestApplyInterrupted(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		seed(t, b, "billing", 20)
		r, err := dlq.Apply(ctx, b, "billing", dlq.Filter{}, dlq.Redrive, dlq.Options{PageSize: 5}, func(done int) {
			if done >= 10 {
				cancel()
			}
		})
		if !errors.Is(err, context.Canceled) || r.Done != 10 {
			t.Fatalf("%+v %v", r, err)
		}
		st, _ := b.Stats(context.Background(), "billing")
		if st.Ready != 10 || st.DeadLettered != 10 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// ScanIncomplete knows the brokers' incomplete-scan errors (by their
// sentinels' texts, since the package imports no broker), however wrapped,
// and nothing else.
func TestScanIncomplete(t *testing.T) {
	for _, err := range []error{
		sqs.ErrScanIncomplete,
		&sqs.ScanError{Queue: "q", Remaining: 1, Reason: "r"},
		rabbitmq.ErrScanIncomplete,
		fmt.Errorf("redrive: %w", &rabbitmq.ScanError{Queue: "q"}),
		errors.Join(errors.New("one page failed"), &sqs.ScanError{Queue: "q"}),
	} {
		if !dlq.ScanIncomplete(err) {
			t.Errorf("ScanIncomplete(%v) = false", err)
		}
	}
	for _, err := range []error{nil, sdk.ErrNotFound, errors.New("berth/sqs: dead-letter scan"), fmt.Errorf("x: %w", sdk.ErrClosed)} {
		if dlq.ScanIncomplete(err) {
			t.Errorf("ScanIncomplete(%v) = true", err)
		}
	}
}

func TestEscapeJSON(t *testing.T) {
	for _, s := range []string{"plain", "é ü 日本", "a\u202eb\u2066c\u009bd\u0085e\x7ff\u061cg", "\ufffd", "id\u200b\ufeff\u00ad\U000e0041\u3164"} {
		b, err := json.Marshal(map[string]string{"k" + s: s})
		if err != nil {
			t.Fatal(err)
		}
		e := dlq.EscapeJSON(b)
		if strings.ContainsFunc(string(e), func(r rune) bool {
			return r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x202e || r == 0x2066 || r == 0x061c ||
				r == 0x200b || r == 0xfeff || r == 0xad || r == 0xe0041 || r == 0x3164
		}) {
			t.Errorf("%q: raw control left in %q", s, e)
		}
		var back map[string]string
		if err := json.Unmarshal(e, &back); err != nil || back["k"+s] != s {
			t.Errorf("%q: %q does not decode to the same: %v %q", s, e, err, back)
		}
	}
}

// Every default-ignorable code point (Unicode's Default_Ignorable_Code_Point:
// format characters, Other_Default_Ignorable_Code_Point and the variation
// selectors; white space aside) shows as nothing: EscapeText and EscapeJSON
// write each as an escape, so that "job-1" followed by one is not shown as
// "job-1". Before, the variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF,
// the Mongolian ones) were left raw.
func TestEscapeDefaultIgnorables(t *testing.T) {
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if !unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) || unicode.IsSpace(r) {
			continue
		}
		s := "job-1" + string(r)
		if got := dlq.EscapeText(s, false); strings.ContainsRune(got, r) {
			t.Errorf("EscapeText(%q) = %q: %U left raw", s, got, r)
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		e := dlq.EscapeJSON(b)
		var back string
		if err := json.Unmarshal(e, &back); err != nil || back != s {
			t.Errorf("EscapeJSON(%s) = %s decodes to %q (%v)", b, e, back, err)
		}
		if strings.ContainsRune(string(e), r) {
			t.Errorf("EscapeJSON(%s) = %s: %U left raw", b, e, r)
		}
	}
}
