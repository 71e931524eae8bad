package postgres_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestStatsWithInfiniteDueTimes: rows whose available_at is '-infinity',
// 'infinity' or centuries ago (written by hand or by another tool; the
// claim takes the '-infinity' one at once) do not fail Stats, which the
// dashboard and berth doctor read. now() cannot be subtracted from
// '-infinity' ("cannot subtract infinite timestamps"), so Stats failed for
// as long as such a row was ready; a due time centuries ago gave an age
// that overflowed time.Duration.
func TestStatsWithInfiniteDueTimes(t *testing.T) {
	pool := newPool(t, "berth-stats-inf-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute, PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "inf"
	msgs := []*sdk.Message{{Body: []byte("past")}, {Body: []byte("ancient")}, {Body: []byte("future")}, {Body: []byte("now")}}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	for i, at := range []string{"-infinity", "1500-01-01 00:00:00+00", "infinity"} {
		if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET available_at = $2::timestamptz WHERE message_id = $1`, msgs[i].ID, at); err != nil {
			t.Fatal(err)
		}
	}
	s, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatalf("Stats with a row due at '-infinity': %v", err)
	}
	if s.Ready != 3 || s.Delayed != 1 || s.InFlight != 0 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v; want 3 ready ('-infinity', 1500, now), 1 delayed ('infinity')", s)
	}
	if longest := time.Duration(math.MaxInt64).Truncate(time.Microsecond); s.OldestAge != longest {
		t.Errorf("OldestAge = %v; want the longest Duration, %v", s.OldestAge, longest)
	}

	// Only the 1500 row ready: its age (over 500 years) is clamped too.
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET available_at = now() + interval '1 hour'
		WHERE message_id = ANY($1)`, []string{msgs[0].ID, msgs[3].ID}); err != nil {
		t.Fatal(err)
	}
	if s, err = b.Stats(ctx, q); err != nil {
		t.Fatal(err)
	}
	if s.Ready != 1 || s.Delayed != 3 || s.OldestAge <= 0 || s.OldestAge < 200*365*24*time.Hour {
		t.Errorf("Stats = %+v; want 1 ready, 3 delayed, OldestAge the longest Duration", s)
	}
}

// TestDeadLetterPagesBefore1970AndInfinite: the dead-letter walk (the CLI's
// and the dashboard's pages) goes through dead letters whose updated_at is
// before 1970 (a negative position, which the cursor's "-" separator cut
// wrongly: the next page failed as an invalid cursor) or ±infinity (which
// no time.Time holds: the page failed to scan), in order, by DeadLetterPage
// and by DeadLetterMark and DeadLetterPageTo.
func TestDeadLetterPagesBefore1970AndInfinite(t *testing.T) {
	pool := newPool(t, "berth-dlq-old-"+suffix(), 4)
	t.Run("before 1970", func(t *testing.T) {
		walkDeadLetters(t, pool, []string{"1900-01-01 00:00:00+00", "1969-12-31 23:59:59.5+00", "1970-01-01 00:00:00+00",
			"1970-01-01 00:00:00+00", "2001-02-03 04:05:06.789+00"})
	})
	t.Run("infinite", func(t *testing.T) {
		walkDeadLetters(t, pool, []string{"-infinity", "1900-01-01 00:00:00+00", "1969-12-31 23:59:59.5+00", "1970-01-01 00:00:00+00",
			"1970-01-01 00:00:00+00", "2001-02-03 04:05:06.789+00", "infinity"})
	})
	// Past the microseconds since 1970 an int64 holds (year 294247), up to
	// the latest time PostgreSQL holds: the position wraps round to a
	// negative number, and back again when pgx sends it (as microseconds
	// since 2000, which fit), so the walk goes on in order.
	t.Run("after year 294247", func(t *testing.T) {
		walkDeadLetters(t, pool, []string{"2001-02-03 04:05:06.789+00", "294247-01-10 04:00:54.775807+00", "294247-01-10 04:00:54.775808+00",
			"294260-06-01 12:00:00.5+00", "294260-06-01 12:00:00.5+00", "294276-12-31 23:59:59.999999+00", "infinity"})
	})
}

// walkDeadLetters dead-letters one job per time (updated_at, ascending) and
// walks them by every kind of page.
func walkDeadLetters(t *testing.T, pool *pgxpool.Pool, times []string) {
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute, PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "old"
	var msgs []*sdk.Message
	for i := range times {
		msgs = append(msgs, &sdk.Message{Body: []byte{byte('a' + i)}})
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, at := range times {
		if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET status = 'dead_letter', updated_at = $2::timestamptz
			WHERE message_id = $1`, msgs[i].ID, at); err != nil {
			t.Fatal(err)
		}
		want = append(want, msgs[i].ID) // published in order: ids ascend, and the two 1970 rows sort by id
	}

	for _, limit := range []int{1, 2, 100} {
		var (
			got    []string
			cursor string
		)
		for pages := 0; ; pages++ {
			if pages > len(times) {
				t.Fatalf("limit %d: the walk does not end", limit)
			}
			page, next, err := b.DeadLetterPage(ctx, q, cursor, limit)
			if err != nil {
				t.Fatalf("limit %d: page after cursor %q: %v", limit, cursor, err)
			}
			for _, m := range page {
				got = append(got, m.ID)
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if !slices.Equal(got, want) {
			t.Errorf("limit %d: DeadLetterPage walk = %q; want %q", limit, got, want)
		}
	}

	mark, err := b.DeadLetterMark(ctx, q)
	if err != nil {
		t.Fatalf("DeadLetterMark with an 'infinity' row: %v", err)
	}
	// Dead-lettered after the mark: not part of the walk to it.
	late := &sdk.Message{Body: []byte("late")}
	if err := b.Publish(ctx, q, late); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET status = 'dead_letter', updated_at = 'infinity'
		WHERE message_id = $1`, late.ID); err != nil { // after any mark, even an 'infinity' one (a larger id)
		t.Fatal(err)
	}
	var (
		got    []string
		cursor string
	)
	for pages := 0; ; pages++ {
		if pages > len(times) {
			t.Fatal("walk to the mark does not end")
		}
		page, next, err := b.DeadLetterPageTo(ctx, q, cursor, mark, 2)
		if err != nil {
			t.Fatalf("page to mark %q after cursor %q: %v", mark, cursor, err)
		}
		for _, m := range page {
			got = append(got, m.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if !slices.Equal(got, want) {
		t.Errorf("DeadLetterPageTo walk = %q; want %q", got, want)
	}
	if s, err := b.Stats(ctx, q); err != nil || s.DeadLettered != int64(len(times)+1) {
		t.Errorf("Stats = %+v, %v; want %d dead letters", s, err, len(times)+1)
	}
}

// TestDeadLetterCursorRefusesGarbage: a cursor that is no position is
// refused as before, the new forms (negative, ±infinity) notwithstanding.
func TestDeadLetterCursorRefusesGarbage(t *testing.T) {
	pool := newPool(t, "berth-dlq-cursor-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	for _, c := range []string{"-", "--", "-1", "1", "x-1", "1-x", "infinit-1", "-infinity", "1-", "-1-"} {
		if _, _, err := b.DeadLetterPage(ctx, "q", c, 10); err == nil {
			t.Errorf("DeadLetterPage(cursor %q) = nil error; want an invalid cursor", c)
		}
	}
	for _, c := range []string{"-5-1", "-infinity-1", "infinity-1", "0-0", "-210866803200000000-1"} {
		if _, _, err := b.DeadLetterPage(ctx, "q", c, 10); err != nil {
			t.Errorf("DeadLetterPage(cursor %q) = %v; want a valid cursor", c, err)
		}
	}
}
