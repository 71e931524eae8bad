package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
)

// records is a slog.Handler that keeps every record, for tests that count
// log lines and read their attributes.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// at returns the records at level whose message contains text.
func (h *records) at(level slog.Level, text string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, text) {
			out = append(out, r)
		}
	}
	return out
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestBadRowsAreSetAside: rows written into the table directly with headers
// that do not decode or that sdk validation refuses are parked at once with
// the reason, logged once at ERROR with their untrusted text escaped, and
// the rows behind them are published — except the later rows of a bad
// row's ordering key, which wait behind it as behind any parked row. An
// operator lists them, repairs one and requeues it. Before, every pass
// failed on the first such row (a scan error) and nothing was ever
// published again.
func TestBadRowsAreSetAside(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	insert := func(id, key, headers string) int64 {
		t.Helper()
		var rowID int64
		if err := pool.QueryRow(ctx, `INSERT INTO `+table+` (queue, message_id, job_type, ordering_key, headers) VALUES ('q', $1, 'x', $2, $3::jsonb) RETURNING id`,
			id, key, headers).Scan(&rowID); err != nil {
			t.Fatal(err)
		}
		return rowID
	}
	notJSONObject := insert("bad-number\x1b[31m\nforged", "", `{"a": 1}`)
	null := insert("bad-null", "", `{"a": "x", "b": null}`)
	reserved := insert("bad-reserved", "", `{"berth-attempt": "9"}`)
	emptyName := insert("bad-empty", "k", `{"": "v"}`)
	good := &sdk.Message{Type: "x"}
	behindKey := &sdk.Message{Type: "x", Key: "k"} // after emptyName, same key
	add(t, pool, box, "q", good, behindKey)

	logs := &records{}
	opts := outbox.RelayOptions{Logger: slog.New(logs)}
	for range 2 { // the second pass finds nothing new to set aside
		if _, err := box.RelayOnce(ctx, b, opts); err != nil {
			t.Fatalf("RelayOnce with bad rows in the table: %v", err)
		}
	}
	if got := drain(t, b, "q", 1); got[good.ID] == nil {
		t.Fatalf("the good row behind the bad ones was not published: %v", got)
	}

	parked, err := box.Parked(ctx, 0)
	if err != nil {
		t.Fatalf("Parked with an undecodable row: %v", err)
	}
	want := map[int64]string{notJSONObject: "JSON object of strings", null: `header "b" is null`, reserved: "reserved", emptyName: "non-empty"}
	if len(parked) != len(want) {
		t.Fatalf("parked %d rows, want %d: %+v", len(parked), len(want), parked)
	}
	for _, p := range parked {
		if !strings.HasPrefix(p.LastError, "outbox: set aside") || !strings.Contains(p.LastError, want[p.ID]) {
			t.Errorf("row %d parked with %q; want the set-aside reason naming %q", p.ID, p.LastError, want[p.ID])
		}
		if p.Attempts != 0 {
			t.Errorf("row %d set aside with %d attempts; want 0 (never published)", p.ID, p.Attempts)
		}
	}
	if pending, err := box.Pending(ctx); err != nil || pending != 1 {
		t.Fatalf("pending: %d, %v; want 1 (the row behind the bad row of its key)", pending, err)
	}

	errs := logs.at(slog.LevelError, "set aside")
	if len(errs) != len(want) {
		t.Fatalf("%d ERROR lines for rows set aside over two passes, want %d (one each)", len(errs), len(want))
	}
	for _, r := range errs {
		for _, k := range []string{"message_id", "reason", "queue"} {
			if v := attr(r, k); strings.ContainsAny(v, "\x1b\n") {
				t.Errorf("log attribute %s not escaped: %q", k, v)
			}
		}
	}

	// Repair the keyed row and requeue it: it is published, then the row
	// behind it.
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET headers = '{"h": "v"}' WHERE id = $1`, emptyName); err != nil {
		t.Fatal(err)
	}
	if n, err := box.Requeue(ctx, emptyName); err != nil || n != 1 {
		t.Fatalf("Requeue: %d, %v", n, err)
	}
	for range 2 {
		if _, err := box.RelayOnce(ctx, b, opts); err != nil {
			t.Fatal(err)
		}
	}
	got := drain(t, b, "q", 2)
	if got[behindKey.ID] == nil || got["bad-empty"] == nil || got["bad-empty"].Header("h") != "v" {
		t.Fatalf("after the repair: %v; want the repaired row and the row behind it", got)
	}
}

// delays records the Delay of every message published through it.
type delays struct {
	sdk.Publisher
	mu  sync.Mutex
	got map[string]time.Duration
}

func (d *delays) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	d.mu.Lock()
	for _, m := range msgs {
		d.got[m.ID] = m.Delay
	}
	d.mu.Unlock()
	return d.Publisher.Publish(ctx, q, msgs...)
}

// TestDelayCountsFromTheWrite: a message's Delay counts from Add, not from
// the relay: a row that waited in the outbox (a relay that was down) is
// published with what is left of its Delay, none once it has passed. The
// rows' created_at is moved back to stand for the wait. Before, every row
// was published with its whole Delay, however long it had waited.
func TestDelayCountsFromTheWrite(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	waited := &sdk.Message{Type: "x", Delay: time.Hour} // written 59 min ago
	past := &sdk.Message{Type: "x", Delay: time.Minute} // written 2 min ago
	fresh := &sdk.Message{Type: "x", Delay: time.Hour}  // just written
	none := &sdk.Message{Type: "x"}                     // no delay
	add(t, pool, box, "q", waited, past, fresh, none)
	for id, back := range map[string]string{waited.ID: "59 minutes", past.ID: "2 minutes"} {
		if _, err := pool.Exec(ctx, `UPDATE `+table+` SET created_at = created_at - $2::interval WHERE message_id = $1`, id, back); err != nil {
			t.Fatal(err)
		}
	}
	pub := &delays{Publisher: b, got: map[string]time.Duration{}}
	if n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{}); err != nil || n != 4 {
		t.Fatalf("RelayOnce: %d, %v; want 4, nil", n, err)
	}
	if d := pub.got[waited.ID]; d <= 0 || d > time.Minute {
		t.Errorf("a 1h delay written 59 min ago was published with delay %s; want at most the 1 min left", d)
	}
	if d := pub.got[past.ID]; d != 0 {
		t.Errorf("a 1 min delay written 2 min ago was published with delay %s; want 0", d)
	}
	if d := pub.got[fresh.ID]; d > time.Hour || d < 30*time.Minute {
		t.Errorf("a 1h delay just written was published with delay %s; want nearly 1h", d)
	}
	if d := pub.got[none.ID]; d != 0 {
		t.Errorf("a message without delay was published with delay %s", d)
	}
	// Every row was published and deleted.
	var stored int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("rows left: %d, %v", stored, err)
	}
}

// TestRelayErrorEscapesMessageID: the error of a pass names a failed row's
// message ID, which is untrusted text (any valid UTF-8 passes Add): it is
// escaped, so a terminal escape sequence in an ID does not reach a log or a
// terminal raw.
func TestRelayErrorEscapesMessageID(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	m := &sdk.Message{ID: "id\x1b[2J\nforged", Type: "bad"}
	add(t, pool, box, "q", m)
	_, err := box.RelayOnce(ctx, refusing{b}, outbox.RelayOptions{})
	if err == nil {
		t.Fatal("RelayOnce: nil error, want the refusal")
	}
	if text := err.Error(); strings.ContainsAny(text, "\x1b\n") || !strings.Contains(text, `id\x1b[2J\nforged`) {
		t.Fatalf("error %q: want the message ID escaped", text)
	}
}
