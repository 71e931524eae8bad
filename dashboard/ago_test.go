package dashboard

import (
	"strings"
	"testing"
)

// A last failure in the future (a forged header, or the clock of the
// worker that dead-lettered it ahead of the dashboard's) is shown as the
// time it is: before, its age came out negative ("-9223372036s ago").
func TestAgoOfAFutureTime(t *testing.T) {
	ago := funcs["ago"].(func(string) string)
	const ts = "9999-01-01T00:00:00Z"
	if got := ago(ts); got != ts {
		t.Errorf("ago(%q) = %q, want the time as it is", ts, got)
	}
	if got := ago("2001-02-03T04:05:06Z"); strings.HasPrefix(got, "-") || !strings.HasSuffix(got, "d ago") {
		t.Errorf("ago of a past time = %q, want its age in days", got)
	}
}
