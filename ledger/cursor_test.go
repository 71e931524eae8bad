package ledger_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
)

// TestCursorPastInt64: a cursor holds any time PostgreSQL holds, to the
// end of year 294276, beyond the microseconds since 1970 an int64 holds
// (year 294247), where it used to wrap round to a time DecodeCursor
// refused. A cursor after year 294276, or not all digits past an int64,
// is a bad filter.
func TestCursorPastInt64(t *testing.T) {
	for _, at := range []time.Time{
		time.UnixMicro(1<<63 - 1),
		time.UnixMicro(1<<63 - 1).Add(time.Microsecond),
		time.Date(294260, 6, 1, 12, 0, 0, 500000000, time.UTC),
		time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC),
		time.Unix(0, 5000),
		time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC),
	} {
		got, id, err := ledger.DecodeCursor(ledger.Cursor(at, "x:y"))
		if err != nil || !got.Equal(at) || id != "x:y" {
			t.Errorf("%s: cursor decodes to %s %q, %v", at, got, id, err)
		}
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	// One past an int64, written out: a time in year 294247.
	if _, _, err := ledger.DecodeCursor(enc("9223372036854775808:x")); err != nil {
		t.Errorf("a cursor one past an int64: %v; want a time", err)
	}
	for _, c := range []string{
		ledger.Cursor(time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC), "x"),
		enc("99999999999999999999999999:x"),
		enc("+9223372036854775809:x"),
		enc("92233720368547758a9:x"),
	} {
		if _, _, err := ledger.DecodeCursor(c); !errors.Is(err, ledger.ErrInvalidFilter) {
			t.Errorf("cursor %q: %v; want ErrInvalidFilter", c, err)
		}
	}
}
