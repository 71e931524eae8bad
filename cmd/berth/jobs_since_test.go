package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestJobsSincePagesKeepTheWindow: "berth jobs -since D -after CURSOR"
// counted the window again from now on every page, so it slid between the
// pages: a job updated near the window's start, on the first page's window,
// was out of the next page's and never shown (and the totals of the pages
// disagreed). The cursor printed now holds the first page's window: five
// jobs updated 59m30s before the first page are all shown, once each, on
// pages asked for 10 minutes apart, each counting 5.
func TestJobsSincePagesKeepTheWindow(t *testing.T) {
	ctx := context.Background()
	dsn, schema, s := migratedLedger(t, "cli_since_")
	first := time.Now().Truncate(time.Second)
	var evs []ledger.Event
	for i := range 5 {
		evs = append(evs, ledger.Event{MessageID: fmt.Sprintf("job-%d", i), Queue: "emails", Type: "email.send", Status: ledger.StatusSucceeded,
			Attempt: 1, At: first.Add(-time.Hour + 30*time.Second + time.Duration(i)*time.Millisecond), Class: sdk.ClassTransient})
	}
	if err := s.Write(ctx, evs); err != nil {
		t.Fatal(err)
	}
	page := func(now time.Time, args ...string) result {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"jobs", "-db", dsn, "-schema", schema, "-queue", "emails", "-since", "1h", "-limit", "2"}, args...),
			env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: func() time.Time { return now }})
		return result{out.String(), errOut.String(), code}
	}
	seen := map[string]int{}
	after, now := "", first
	for pages := 0; ; pages++ {
		if pages == 5 {
			t.Fatalf("still paging after %d pages: %v", pages, seen)
		}
		args := []string{"-json"}
		if after != "" {
			args = append(args, "-after", after)
		}
		r := page(now, args...)
		var v jsonJobs
		if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK {
			t.Fatalf("page %d, 10m after the one before: exit %d, %v\n%s%s", pages+1, r.code, err, r.out, r.err)
		}
		if v.Total == nil || *v.Total != 5 {
			t.Errorf("page %d counts %v jobs, want 5", pages+1, v.Total)
		}
		for _, j := range v.Jobs {
			seen[j.ID]++
		}
		if v.Next == nil {
			break
		}
		after, now = *v.Next, now.Add(10*time.Minute)
	}
	for i := range 5 {
		if id := fmt.Sprintf("job-%d", i); seen[id] != 1 {
			t.Errorf("%s shown %d times over the pages (all: %v)", id, seen[id], seen)
		}
	}

	// The text output prints the same cursor; a ledger cursor alone (no
	// window) still works; a window that is no time is a usage error.
	r := page(first)
	_, next, _ := strings.Cut(r.out, "next page: -after ")
	next = strings.TrimSpace(next)
	ledgerCursor, _, ok := strings.Cut(next, ".")
	if r.code != exitOK || !ok || !strings.Contains(r.out, "2 job(s) shown of 5 matching") {
		t.Fatalf("jobs text: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if r := page(first.Add(10*time.Minute), "-after", next); r.code != exitOK || !strings.Contains(r.out, "2 job(s) shown of 5 matching") {
		t.Errorf("jobs -after %s: exit %d\n%s%s", next, r.code, r.out, r.err)
	}
	if r := page(first, "-after", ledgerCursor); r.code != exitOK || !strings.Contains(r.out, "2 job(s) shown of 5 matching") {
		t.Errorf("jobs -after a ledger cursor: exit %d\n%s%s", r.code, r.out, r.err)
	}
	for _, bad := range []string{ledgerCursor + ".x", ledgerCursor + ".999999999999999999", ledgerCursor + ".-9223372036854775808", "." + "1700000000000000"} {
		if r := page(first, "-after", bad); r.code != exitUsage || !strings.Contains(r.err, "-after: malformed cursor") {
			t.Errorf("jobs -after %s: exit %d, %s", bad, r.code, r.err)
		}
	}
}
