package doctor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// deadJobs is a ledger.Reader whose dead jobs all failed, transiently and
// after retries, with one error.
type deadJobs struct {
	ledger.Reader
	lastError string
}

func (d deadJobs) List(_ context.Context, f ledger.Filter) (ledger.Page, error) {
	if len(f.Statuses) != 1 || f.Statuses[0] != ledger.StatusDead {
		return ledger.Page{}, nil
	}
	var p ledger.Page
	for i := range 3 {
		p.Jobs = append(p.Jobs, ledger.Job{MessageID: string(rune('a' + i)), Status: ledger.StatusDead, Attempts: 5,
			LastError: d.lastError, ErrorClass: sdk.ClassTransient})
	}
	return p, nil
}

func (deadJobs) Counts(context.Context, ledger.Window) (ledger.Counts, error) {
	return ledger.Counts{ByStatus: map[ledger.Status]int64{}, ByClass: map[sdk.ErrorClass]int64{}}, nil
}

// A Finding's text is what was read, as it was read: whoever shows it
// escapes it once (berth doctor does, its -json is JSON). The evidence of
// ledger.same-error-exhausted quoted the error with %q after escaping it,
// so a backslash in it came out as four (six on berth doctor's terminal),
// and -json carried escapes instead of the error's text.
func TestSameErrorEvidenceIsTheErrorAsRead(t *testing.T) {
	const cause = `open C:\jobs\in: access denied` + "\u200b"
	fs, err := doctor.Ledger(context.Background(), deadJobs{lastError: cause}, time.Minute, doctor.Options{SameError: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.ID != "ledger.same-error-exhausted" {
			continue
		}
		if f.Severity != doctor.Warn || !strings.Contains(f.Evidence, `with the error "`+cause+`"`) {
			t.Fatalf("evidence %q, want the error %q as read", f.Evidence, cause)
		}
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var back doctor.Finding
		if err := json.Unmarshal(b, &back); err != nil || !strings.Contains(back.Evidence, cause) {
			t.Fatalf("the JSON finding does not carry the error: %s", b)
		}
		return
	}
	t.Fatalf("no ledger.same-error-exhausted finding in %+v", fs)
}

// A queue name doctor is given (or reads from the jobs table) is quoted in
// a Finding as it is: with %q, a backslash in it showed doubled, four
// times on berth doctor's terminal, and an escape read as an escape of one.
func TestQueueNamesAreQuotedAsTheyAre(t *testing.T) {
	u, _, _ := pgURL(t, nil)
	b := open(t, u)
	ctx := testCtx(t)
	publish(t, b, "billing", 1)
	const misspelt = `bi\lling`
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{misspelt, "reports"}})
	if err != nil {
		t.Fatal(err)
	}
	f := find(fs, "postgres.queue-unknown", misspelt)
	if len(f) != 1 || !strings.Contains(f[0].Fix, `use "`+misspelt+`"`) || !strings.Contains(f[0].Summary, `queue "billing" has rows`) {
		t.Fatalf("queue-unknown of %s: %+v", misspelt, f)
	}
}
