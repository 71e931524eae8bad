package sdk_test

import (
	"testing"

	"github.com/berthq/berth/sdk"
)

// A redrive count is a header, which a producer outside berth can forge.
// PrepareRedrive added one to strconv.Atoi of it: "-1" came back "0" (a
// redrive that counted none), "-5" negative, MaxInt64 overflowed to
// MinInt64, and the job ledger, reading the count as the job's generation,
// dropped the redriven job's events as older than its row. A count that is
// not 1 to 9 ASCII digits is now none, as the PostgreSQL broker's redrive
// reads it, and its redrive is 1.
func TestRedriveCountForged(t *testing.T) {
	for _, c := range []struct {
		header      string
		count       int
		redriveTo   string
		headerIsSet bool
	}{
		{"", 0, "1", false},
		{"0", 0, "1", true},
		{"7", 7, "8", true},
		{"007", 7, "8", true},
		{"999999998", 999999998, "999999999", true},
		{"-1", 0, "1", true},
		{"-5", 0, "1", true},
		{"+3", 0, "1", true},
		{" 3", 0, "1", true},
		{"3\n", 0, "1", true},
		{"1000000000", 0, "1", true},
		{"99999999999", 0, "1", true},
		{"9223372036854775807", 0, "1", true},
		{"-9223372036854775808", 0, "1", true},
		{"٣", 0, "1", true}, // a digit, not an ASCII one
		{"not a number", 0, "1", true},
	} {
		m := &sdk.Message{ID: "m"}
		if c.headerIsSet {
			m.SetHeader(sdk.HeaderRedriveCount, c.header)
		}
		if got := sdk.RedriveCount(m); got != c.count {
			t.Errorf("RedriveCount(%q) = %d, want %d", c.header, got, c.count)
		}
		sdk.PrepareRedrive(m, "q")
		if got := m.Header(sdk.HeaderRedriveCount); got != c.redriveTo {
			t.Errorf("PrepareRedrive of count %q wrote %q, want %q", c.header, got, c.redriveTo)
		}
	}
}
