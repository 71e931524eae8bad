package dashboard

import (
	"strings"
	"testing"
	"time"
)

// A banner is kept resultTTL, and at most maxResults of them: tokens
// nobody fetched do not pile up.
func TestResultsExpireAndAreBounded(t *testing.T) {
	r := newResults()
	now := time.Unix(1_700_000_000, 0)
	r.now = func() time.Time { return now }
	late := r.put("billing", "redriven 1 dead letter(s)")
	now = now.Add(resultTTL + time.Second)
	if got := r.take("billing", late); got != "" {
		t.Errorf("an expired banner was shown: %q", got)
	}
	first := r.put("billing", "first")
	for range maxResults + 10 {
		now = now.Add(time.Millisecond)
		r.put("billing", "more")
	}
	if n := len(r.m); n > maxResults {
		t.Errorf("%d banners kept, want at most %d", n, maxResults)
	}
	if got := r.take("billing", first); got != "" {
		t.Errorf("the oldest banner was kept past the bound: %q", got)
	}
	tok := r.put("billing", "last")
	if r.take("emails", tok) != "" || r.take("billing", tok) != "last" || r.take("billing", tok) != "" {
		t.Error("a banner is shown once, on its own queue's page")
	}
}

// A banner is kept only for a valid queue name: the name comes from the
// request's path (up to the server's 1 MiB header limit), and a resume of
// a made-up name is answered "nothing changed". Kept, a thousand such
// names held a gigabyte for resultTTL.
func TestResultsKeepNoInvalidQueueName(t *testing.T) {
	r := newResults()
	for _, q := range []string{strings.Repeat("q", 1<<20), "", "a b", ".x"} {
		if tok := r.put(q, "The queue was not paused: nothing changed."); tok != "" {
			t.Errorf("put(%.20q…) = %q, want no token", q, tok)
		}
	}
	if n := len(r.m); n != 0 {
		t.Errorf("%d banners kept for invalid queue names", n)
	}
}
