package pgledger

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
)

// TestHistoryTimeReadsPostgres: the history column holds times as
// PostgreSQL's jsonb writes them when the upsert copies a row's times there,
// in the writing session's time zone: every one reads back as the row's
// column reads (readTime), whatever the zone (local mean time before 1900
// gives offsets with seconds), the era or the year.
func TestHistoryTimeReadsPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	values := []string{"infinity", "-infinity", "2026-12-04 17:00:00.123456+00", "1969-12-31 23:59:59.5+00", "1900-01-01 00:00:00+00",
		"1850-06-01 12:00:00+00", "0001-01-01 00:00:00+00", "0001-12-31 23:59:59+00 BC", "0001-01-01 00:00:00+00 BC", "0002-12-31 00:00:00+00 BC",
		"4714-11-24 00:00:00+00 BC", "0044-03-15 12:00:00+00 BC", "2024-02-29 00:00:00+00", "0005-02-29 00:00:00+00 BC", "9999-12-31 23:59:59.999999+00",
		"10000-01-01 00:00:00+00", "294276-12-31 23:59:59.999999+00"}
	for _, zone := range []string{"UTC", "Europe/Amsterdam", "Asia/Kolkata", "America/St_Johns", "Pacific/Chatham"} {
		if _, err := conn.Exec(ctx, `SELECT set_config('TimeZone', $1, false)`, zone); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			var js []byte
			var col pgtype.Timestamptz
			if err := conn.QueryRow(ctx, `SELECT to_jsonb($1::timestamptz), $1::timestamptz`, v).Scan(&js, &col); err != nil {
				t.Fatalf("%s in %s: %v", v, zone, err)
			}
			var h historyTime
			if err := json.Unmarshal(js, &h); err != nil {
				t.Errorf("%s in %s: history %s: %v", v, zone, js, err)
				continue
			}
			if want := readTime(col); !h.t.Equal(want) {
				t.Errorf("%s in %s: history %s reads %s; the column %s", v, zone, js, h.t, want)
			}
		}
	}
	// And as the Go side writes them.
	for _, tm := range []time.Time{time.Now(), time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC), ledger.Infinity, ledger.NegativeInfinity} {
		b, err := json.Marshal(historyTime{tm})
		if err != nil {
			t.Fatal(err)
		}
		var h historyTime
		if err := json.Unmarshal(b, &h); err != nil || !h.t.Equal(tm) {
			t.Errorf("%s written %s reads %s, %v", tm, b, h.t, err)
		}
	}
}

// TestCursorAnyPosition: a cursor holds any position a row of the ledger
// may have, and gives it back exactly.
func TestCursorAnyPosition(t *testing.T) {
	for _, ts := range []pgtype.Timestamptz{
		{InfinityModifier: pgtype.Infinity, Valid: true},
		{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
		{Time: time.Date(1900, 1, 1, 0, 0, 0, 500000000, time.UTC), Valid: true},
		{Time: time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC), Valid: true},
		{Time: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), Valid: true},
		{Time: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), Valid: true},
		{Time: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), Valid: true},
		{Time: time.UnixMicro(math.MaxInt64), Valid: true},
		{Time: time.Date(294250, 6, 1, 12, 0, 0, 123456000, time.UTC), Valid: true},
		{Time: time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC), Valid: true},
	} {
		at, id, err := ledger.DecodeCursor(ledger.Cursor(cursorTime(ts), "x:y"))
		if err != nil || id != "x:y" {
			t.Errorf("%+v: cursor decodes to %s %q, %v", ts, at, id, err)
			continue
		}
		if got := queryTime(at); got.InfinityModifier != ts.InfinityModifier || !got.Time.Equal(ts.Time) {
			t.Errorf("%+v: cursor gives %+v", ts, got)
		}
	}
}
