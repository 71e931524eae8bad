package pgledger_test

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// Text from a message is untrusted: a NUL (valid UTF-8, so sdk.Prepare lets
// it through) or invalid UTF-8 (a foreign producer) in one event must not
// fail the batch's statement and lose the other jobs' events. The event is
// stored with U+FFFD in place of what PostgreSQL cannot hold.
func TestUntrustedTextDoesNotPoisonBatch(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	for _, evil := range []ledger.Event{
		{MessageID: "evil-type", Queue: "q", Type: "a\x00b", Status: ledger.StatusRunning, Attempt: 1, At: now},
		{MessageID: "evil-error", Queue: "q", Type: "charge", Status: ledger.StatusRetrying, Attempt: 1, At: now,
			Error: sdk.SanitizeReason("bad body: \x00"), Class: sdk.ClassTransient},
		{MessageID: "evil-utf8", Queue: "q", Type: "charge", IdempotencyKey: "k\xff", CorrelationID: "c\x00", Worker: "w\xfe",
			Status: ledger.StatusRunning, Attempt: 1, At: now},
	} {
		good := ledger.Event{MessageID: "good-" + evil.MessageID, Queue: "q", Type: "charge", Status: ledger.StatusSucceeded, Attempt: 1, At: now}
		if err := s.Write(ctx, []ledger.Event{good, evil}); err != nil {
			t.Fatalf("%s: Write = %v", evil.MessageID, err)
		}
		if _, err := s.Job(ctx, good.MessageID); err != nil {
			t.Errorf("%s: the other job's event: %v", evil.MessageID, err)
		}
		j, err := s.Job(ctx, evil.MessageID)
		if err != nil {
			t.Errorf("%s: %v", evil.MessageID, err)
			continue
		}
		if j.Type == evil.Type && evil.Type != "charge" {
			t.Errorf("%s: type stored as %q", evil.MessageID, j.Type)
		}
	}
	// A NUL in the message ID itself: stored under the replaced ID.
	if err := s.Write(ctx, []ledger.Event{{MessageID: "id\x00", Queue: "q", Status: ledger.StatusRunning, Attempt: 1, At: now}}); err != nil {
		t.Fatalf("Write with a NUL in the ID = %v", err)
	}
	if _, err := s.Job(ctx, "id\uFFFD"); err != nil {
		t.Errorf("job with a NUL in its ID: %v", err)
	}
}

// A generation comes from a message's redrive-count header, which any
// producer can set: one near the integer limit must not make a redrive's
// generation+1 overflow and fail the batch with another job's events.
func TestForgedGenerationDoesNotPoisonBatch(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	if err := s.Write(ctx, []ledger.Event{{MessageID: "x", Queue: "q", Status: ledger.StatusDead, Generation: 2147483647, Attempt: 1, At: now}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, []ledger.Event{
		{MessageID: "other", Queue: "q", Status: ledger.StatusSucceeded, Attempt: 1, At: now},
		{MessageID: "x", Queue: "q", Status: ledger.StatusRedriven, At: now.Add(time.Second)},
	}); err != nil {
		t.Fatalf("Write = %v", err)
	}
	if _, err := s.Job(ctx, "other"); err != nil {
		t.Errorf("the other job's event: %v", err)
	}
	if j, err := s.Job(ctx, "x"); err != nil || j.Status != ledger.StatusRedriven {
		t.Errorf("x after its redrive: %+v, %v", j, err)
	}
}

// A lookup with text PostgreSQL cannot hold (a NUL, invalid UTF-8: from a
// URL of the dashboard) finds what the ledger stored for that text, with
// U+FFFD in place of those bytes, rather than failing the query.
func TestLookupWithUnstorableText(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	if err := s.Write(ctx, []ledger.Event{
		{MessageID: "id\x00", Queue: "q\xff", Type: "a\x00b", IdempotencyKey: "k\xff", Status: ledger.StatusRunning, Attempt: 1, At: now},
	}); err != nil {
		t.Fatal(err)
	}
	if j, err := s.Job(ctx, "id\x00"); err != nil || j.MessageID != "id\uFFFD" {
		t.Errorf("Job = %+v, %v", j, err)
	}
	if j, err := s.JobByKey(ctx, "k\xff"); err != nil || j.MessageID != "id\uFFFD" {
		t.Errorf("JobByKey = %+v, %v", j, err)
	}
	if _, err := s.Job(ctx, "nope\xff"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Job of an unknown ID = %v, want ErrNotFound", err)
	}
	p, err := s.List(ctx, ledger.Filter{Queue: "q\xff", Type: "a\x00b"})
	if err != nil || len(p.Jobs) != 1 {
		t.Errorf("List = %+v, %v", p, err)
	}
	// berth jobs -queue asks Counts the same queue for its total.
	c, err := s.Counts(ctx, ledger.Window{Queue: "q\xff"})
	if err != nil || c.ByStatus[ledger.StatusRunning] != 1 {
		t.Errorf("Counts = %+v, %v; want the one running job", c, err)
	}
}

// A dead letter's class comes from its dead-letter-class header, which a
// foreign producer (or a broker that dead-letters by itself, keeping the
// producer's headers) can set to anything: a NUL or invalid UTF-8 in it must
// not fail the batch's statement and lose the other jobs' events, whether
// the dead letter says its attempt (the upsert) or not (the deadAny update).
func TestUntrustedClassDoesNotPoisonBatch(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	for i, evil := range []ledger.Event{
		{MessageID: "evil-class-att", Queue: "q", Type: "charge", Status: ledger.StatusDead, Attempt: 3, At: now,
			Error: "gone", Class: sdk.ErrorClass("perm\x00anent")},
		{MessageID: "evil-class-any", Queue: "q", Type: "charge", Status: ledger.StatusDead, At: now,
			Error: "gone", Class: sdk.ErrorClass("perm\xffanent")},
	} {
		if evil.Attempt == 0 {
			// deadAny only ends an attempt of an existing row.
			if err := s.Write(ctx, []ledger.Event{{MessageID: evil.MessageID, Queue: "q", Status: ledger.StatusRunning, Attempt: 1, At: now.Add(-time.Second)}}); err != nil {
				t.Fatal(err)
			}
		}
		good := ledger.Event{MessageID: "good-class-" + strconv.Itoa(i), Queue: "q", Type: "charge", Status: ledger.StatusSucceeded, Attempt: 1, At: now}
		if err := s.Write(ctx, []ledger.Event{good, evil}); err != nil {
			t.Fatalf("%s: Write = %v", evil.MessageID, err)
		}
		if _, err := s.Job(ctx, good.MessageID); err != nil {
			t.Errorf("%s: the other job's event: %v", evil.MessageID, err)
		}
		j, err := s.Job(ctx, evil.MessageID)
		if err != nil {
			t.Fatalf("%s: %v", evil.MessageID, err)
		}
		if j.Status != ledger.StatusDead || !strings.Contains(string(j.ErrorClass), "\uFFFD") {
			t.Errorf("%s: status %s, class %q; want dead with the class stored replaced", evil.MessageID, j.Status, j.ErrorClass)
		}
	}
}

// TestUntrustedCursor: a cursor comes from a URL or a command line. One
// holding a time PostgreSQL cannot store is a bad filter
// (ledger.ErrInvalidFilter: the dashboard's 400, the CLI's usage error),
// not a database error; before, "timestamp out of range" came back from
// the query, and a time far enough back wrapped around when encoded and
// was taken as a time in the future. A page ending at the earliest time
// PostgreSQL stores still pages on.
func TestUntrustedCursor(t *testing.T) {
	_, s, ctx := setup(t)
	earliest := time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)
	if err := s.Write(ctx, []ledger.Event{
		{MessageID: "b", Queue: "q", Status: ledger.StatusEnqueued, At: earliest},
		{MessageID: "a", Queue: "q", Status: ledger.StatusEnqueued, At: earliest},
	}); err != nil {
		t.Fatal(err)
	}
	p, err := s.List(ctx, ledger.Filter{Queue: "q", Limit: 1})
	if err != nil || len(p.Jobs) != 1 || p.Jobs[0].MessageID != "b" || p.Next == "" {
		t.Fatalf("first page = %+v, %v", p, err)
	}
	if p, err = s.List(ctx, ledger.Filter{Queue: "q", Limit: 1, After: p.Next}); err != nil || len(p.Jobs) != 1 || p.Jobs[0].MessageID != "a" {
		t.Fatalf("second page = %+v, %v", p, err)
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, c := range []string{
		enc(strconv.FormatInt(earliest.UnixMicro()-1, 10) + ":x"),
		enc(strconv.FormatInt(math.MinInt64, 10) + ":x"),
		enc("-300000000000000000:x"),
		enc("x:y"), enc("1"), "%%%",
	} {
		if _, err := s.List(ctx, ledger.Filter{After: c}); !errors.Is(err, ledger.ErrInvalidFilter) {
			t.Errorf("List(After %q) = %v, want ErrInvalidFilter", c, err)
		}
	}
	// Untrusted but harmless: the largest time, an ID PostgreSQL cannot
	// hold as is.
	for _, c := range []string{enc(strconv.FormatInt(math.MaxInt64, 10) + ":x"), enc("1:\x00\xff")} {
		if _, err := s.List(ctx, ledger.Filter{After: c}); err != nil {
			t.Errorf("List(After %q) = %v, want a page", c, err)
		}
	}
}

// incompressible returns n bytes of random text: PostgreSQL compresses a
// long index value before it checks its size, so a repetitive one would fit.
func incompressible(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)[:n]
}

// A message ID, queue or idempotency key comes from a message (a foreign
// producer's ID or key, which sdk.Prepare does not bound; a dead letter's
// berth-dlq-queue header): one too long for a btree index row (2704 bytes)
// must not fail the batch's statement and lose the other jobs' events, as
// it did ("index row size exceeds btree version 4 maximum", SQLSTATE
// 54000). The job is stored under a shortened value, found by the whole
// one, and two long values sharing their start stay two jobs.
func TestLongIndexedTextDoesNotPoisonBatch(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	longID, longKey, longQueue := incompressible(t, 5000), incompressible(t, 5000), incompressible(t, 5000)
	twinID := longID[:4000] + incompressible(t, 1000)
	for _, evil := range []ledger.Event{
		{MessageID: longID, Queue: "q", Status: ledger.StatusRunning, Attempt: 1, At: now},
		{MessageID: "long-key", Queue: "q", IdempotencyKey: longKey, Status: ledger.StatusRunning, Attempt: 1, At: now},
		{MessageID: "long-queue", Queue: longQueue, Status: ledger.StatusRunning, Attempt: 1, At: now},
		{MessageID: twinID, Queue: longQueue, Status: ledger.StatusRetrying, Attempt: 2, At: now, Error: "e", Class: sdk.ClassTransient},
	} {
		good := ledger.Event{MessageID: "good-" + evil.MessageID[:8], Queue: "q", Status: ledger.StatusSucceeded, Attempt: 1, At: now}
		if err := s.Write(ctx, []ledger.Event{good, evil}); err != nil {
			t.Fatalf("%.20s…: Write = %v", evil.MessageID, err)
		}
		if _, err := s.Job(ctx, good.MessageID); err != nil {
			t.Errorf("%.20s…: the other job's event: %v", evil.MessageID, err)
		}
	}
	// The later events of the jobs land on their rows: a settlement, a
	// broker's dead letter of unknown attempt, a redrive by ID.
	if err := s.Write(ctx, []ledger.Event{
		{MessageID: longID, Queue: "q", Status: ledger.StatusSucceeded, Attempt: 1, At: now.Add(time.Second)},
		{MessageID: twinID, Queue: longQueue, Status: ledger.StatusDead, At: now.Add(time.Second)},
		{MessageID: twinID, Queue: longQueue, Status: ledger.StatusRedriven, At: now.Add(2 * time.Second)},
	}); err != nil {
		t.Fatalf("later events: %v", err)
	}
	if j, err := s.Job(ctx, longID); err != nil || j.Status != ledger.StatusSucceeded || len(j.MessageID) > 1024 {
		t.Errorf("Job(long ID) = %+v, %v; want succeeded, its ID shortened", j, err)
	}
	if j, err := s.Job(ctx, twinID); err != nil || j.Status != ledger.StatusRedriven || j.Generation != 1 {
		t.Errorf("Job(the other long ID) = %+v, %v; want redriven in generation 1", j, err)
	}
	if j, err := s.JobByKey(ctx, longKey); err != nil || j.MessageID != "long-key" {
		t.Errorf("JobByKey(long key) = %+v, %v", j, err)
	}
	p, err := s.List(ctx, ledger.Filter{Queue: longQueue})
	if err != nil || len(p.Jobs) != 2 {
		t.Errorf("List(long queue) = %d jobs, %v; want 2", len(p.Jobs), err)
	}
	if len(p.Jobs) > 0 {
		if _, err := s.Job(ctx, p.Jobs[0].MessageID); err != nil {
			t.Errorf("Job(a listed ID) = %v", err)
		}
	}
	if c, err := s.Counts(ctx, ledger.Window{Queue: longQueue}); err != nil || c.ByStatus[ledger.StatusRunning] != 1 || c.ByStatus[ledger.StatusRedriven] != 1 {
		t.Errorf("Counts(long queue) = %+v, %v", c, err)
	}
}
