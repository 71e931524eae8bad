package postgres_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestEveryQueueMethodRefusesInvalidQueue: every method taking a queue name
// validates it as Publish and Receive do (sdk.ValidateQueueName), before any
// statement. The dead-letter operations and CountByStatus used to send a
// name holding a NUL byte to PostgreSQL, which answered with a raw SQLSTATE
// 22021 error instead of one matching sdk.ErrInvalidQueue; and the calls that
// return early (DeleteDeadLetters of no id, DeadLetterPageTo of the mark "")
// accepted any name.
func TestEveryQueueMethodRefusesInvalidQueue(t *testing.T) {
	pool := newPool(t, "berth-badqueue-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q := "badqueue_" + suffix()
	m := &sdk.Message{Body: []byte("x")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	mark := "0-1"
	for _, bad := range []string{"q\x00x", "\x00", "bad name", ""} {
		calls := map[string]func() error{
			"DeclareQueue": func() error { return b.DeclareQueue(ctx, bad) },
			"Publish":      func() error { return b.Publish(ctx, bad, &sdk.Message{Body: []byte("x")}) },
			"Receive":      func() error { _, err := b.Receive(ctx, bad, 1); return err },
			"Stats":        func() error { _, err := b.Stats(ctx, bad); return err },
			"CountByStatus": func() error {
				_, err := b.CountByStatus(ctx, bad)
				return err
			},
			"ListDeadLetters": func() error { _, err := b.ListDeadLetters(ctx, bad, 10); return err },
			"GetDeadLetter":   func() error { _, err := b.GetDeadLetter(ctx, bad, m.ID); return err },
			"RedriveDeadLetters all": func() error {
				_, err := b.RedriveDeadLetters(ctx, bad)
				return err
			},
			"RedriveDeadLetters ids": func() error {
				_, err := b.RedriveDeadLetters(ctx, bad, m.ID)
				return err
			},
			"PurgeDeadLetters": func() error { _, err := b.PurgeDeadLetters(ctx, bad); return err },
			"DeleteDeadLetters ids": func() error {
				_, err := b.DeleteDeadLetters(ctx, bad, m.ID)
				return err
			},
			"DeleteDeadLetters none": func() error {
				_, err := b.DeleteDeadLetters(ctx, bad)
				return err
			},
			"DeadLetterPage": func() error { _, _, err := b.DeadLetterPage(ctx, bad, "", 10); return err },
			"DeadLetterPage cursor": func() error {
				_, _, err := b.DeadLetterPage(ctx, bad, mark, 10)
				return err
			},
			"DeadLetterMark": func() error { _, err := b.DeadLetterMark(ctx, bad); return err },
			"DeadLetterPageTo": func() error {
				_, _, err := b.DeadLetterPageTo(ctx, bad, "", mark, 10)
				return err
			},
			"DeadLetterPageTo no mark": func() error {
				_, _, err := b.DeadLetterPageTo(ctx, bad, "", "", 10)
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if !errors.Is(err, sdk.ErrInvalidQueue) {
				t.Errorf("%s(%q) = %v, want an error matching sdk.ErrInvalidQueue", name, bad, err)
			}
			var qe *sdk.QueueNameError
			if err != nil && !errors.As(err, &qe) {
				t.Errorf("%s(%q): %v is no *sdk.QueueNameError", name, bad, err)
			}
		}
	}
	// The valid queue was not touched by any of them.
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || counts[postgres.StatusQueued] != 1 || len(counts) != 1 {
		t.Fatalf("CountByStatus(%s) = %v, %v; want the one queued job", q, counts, err)
	}
}

// TestDeadLetterHeadersWithNUL: a header holding a NUL byte, in its name or
// its value, set by the handler on the delivered message (Publish refuses
// one with sdk.ErrInvalidHeader), made DeadLetter fail with SQLSTATE 22P05
// (jsonb cannot hold \u0000) every time: the job could never be
// dead-lettered and came back for ever. Now each NUL becomes U+FFFD (as
// json.Marshal makes invalid UTF-8), the rest of the headers is kept as it
// was, and the dead letter can be listed and redriven.
func TestDeadLetterHeadersWithNUL(t *testing.T) {
	pool := newPool(t, "berth-nulhdr-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	q := "nulhdr_" + suffix()

	// Publish refuses such a header, with a typed error, and stores nothing.
	err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x"), Headers: map[string]string{"k": "a\x00b"}})
	if !errors.Is(err, sdk.ErrInvalidHeader) {
		t.Fatalf("Publish of a header value with NUL = %v, want ErrInvalidHeader", err)
	}
	err = b.Publish(ctx, q, &sdk.Message{Body: []byte("x"), Headers: map[string]string{"k\x00": "v"}})
	if !errors.Is(err, sdk.ErrInvalidHeader) {
		t.Fatalf("Publish of a header name with NUL = %v, want ErrInvalidHeader", err)
	}

	m := &sdk.Message{Body: []byte("x"), Headers: map[string]string{"keep": "as is", "k\uFFFD": "already there"}}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d, %v", len(ds), err)
	}
	d := ds[0]
	// The handler (or middleware) sets headers on the delivered message.
	h := d.Message().Headers
	h["value"] = "a\x00b\x00"
	h["na\x00me"] = "v"
	h["k\x00"] = "collides with k\uFFFD"
	if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad \x00 input"))); err != nil {
		t.Fatalf("DeadLetter with NUL in headers: %v", err)
	}
	dl, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"keep":       "as is",
		"value":      "a\uFFFDb\uFFFD",
		"na\uFFFDme": "v",
		"k\uFFFD":    "already there", // a header already named so keeps its value
	}
	for k, v := range want {
		if got, ok := dl.Headers[k]; !ok || got != v {
			t.Errorf("dead letter header %q = %q (present %v), want %q", k, got, ok, v)
		}
	}
	for k, v := range dl.Headers {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			t.Errorf("dead letter header %q = %q holds NUL", k, v)
		}
	}
	if r := dl.Header(sdk.HeaderDeadLetterReason); !strings.HasSuffix(r, "bad  input") {
		t.Errorf("reason %q, want the cause without its NUL", r)
	}
	if n, err := b.RedriveDeadLetters(ctx, q, m.ID); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v", n, err)
	}
}

// TestExtendLeaseBounded: ExtendLease by more than the broker's longest
// lease (sdk.MaxDelay, 12 h, or Options.Lease when longer) extends it by
// that longest lease. A huge extension used to fail with a raw SQLSTATE
// 22008 (math.MaxInt64 ns: the timestamp overflows) or to park the job for
// centuries, never to come back if its worker died.
func TestExtendLeaseBounded(t *testing.T) {
	pool := newPool(t, "berth-extendmax-"+suffix(), 4)
	ctx := testCtx(t)
	for _, c := range []struct {
		lease time.Duration
		max   time.Duration
	}{
		{time.Minute, sdk.MaxDelay},
		{24 * time.Hour, 24 * time.Hour},
	} {
		b := newBroker(t, pool, postgres.Options{Lease: c.lease})
		q := "extendmax_" + suffix()
		for _, by := range []time.Duration{math.MaxInt64, 100 * 365 * 24 * time.Hour, c.max + time.Second, c.max, time.Hour} {
			m := &sdk.Message{Body: []byte("x")}
			if err := b.Publish(ctx, q, m); err != nil {
				t.Fatal(err)
			}
			ds, err := b.Receive(ctx, q, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Receive = %d, %v", len(ds), err)
			}
			if err := ds[0].ExtendLease(ctx, by); err != nil {
				t.Fatalf("lease %s: ExtendLease(%s) = %v, want nil", c.lease, by, err)
			}
			var leftUS int64
			if err := pool.QueryRow(ctx, `SELECT (extract(epoch FROM visibility_until - now()) * 1e6)::bigint FROM `+
				b.Schema()+`.jobs WHERE message_id = $1 AND available_at = visibility_until`, m.ID).Scan(&leftUS); err != nil {
				t.Fatal(err)
			}
			left := time.Duration(leftUS) * time.Microsecond
			want := min(by, c.max)
			if left > want || left < want-time.Minute {
				t.Errorf("lease %s: ExtendLease(%s) left the lease %s, want about %s", c.lease, by, left, want)
			}
			if err := ds[0].Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
