package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// undecodableLog is the broker's log of a claimed row it cannot decode.
const undecodableLog = "berth/postgres: claimed job cannot be decoded; handed back (no attempt counted)"

// TestUndecodableRowHandedBack: a claimed row holding a value the broker
// cannot decode (a first_failure_at of 'infinity', written by hand: Go's
// time.Time has no infinity) does not strand the rows of its claim. The
// rows that decode are delivered; the one that does not is handed back at
// once, its attempt not counted, and a Receive that claimed only it returns
// a *postgres.DecodeError naming it. The old claim loop returned the scan
// error and left every row of the claim, the healthy ones included,
// 'processing' for the whole lease with an attempt spent.
func TestUndecodableRowHandedBack(t *testing.T) {
	pool := newPool(t, "berth-decode-"+suffix(), 4)
	logs := newLogRecorder()
	b := newBroker(t, pool, postgres.Options{Lease: 10 * time.Minute, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(logs)})
	ctx := testCtx(t)
	q := "decode"
	msgs := []*sdk.Message{{Body: []byte("bad")}, {Body: []byte("good 1")}, {Body: []byte("good 2")}}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var badID int64
	if err := pool.QueryRow(ctx, `UPDATE `+b.Schema()+`.jobs SET first_failure_at = 'infinity'
		WHERE message_id = $1 RETURNING id`, msgs[0].ID).Scan(&badID); err != nil {
		t.Fatal(err)
	}
	// The bad row is handed back, ready, with no attempt counted.
	handedBack := func(when string) {
		t.Helper()
		var (
			status   string
			attempts int
			leased   bool
			due      bool
		)
		if err := pool.QueryRow(ctx, `SELECT status, attempt_count, visibility_until IS NOT NULL, available_at <= now()
			FROM `+b.Schema()+`.jobs WHERE id = $1`, badID).Scan(&status, &attempts, &leased, &due); err != nil {
			t.Fatal(err)
		}
		// 'retry' rather than 'queued': it has a first_failure_at.
		if status != postgres.StatusRetry || attempts != 0 || leased || !due {
			t.Errorf("%s: undecodable job is %s, %d attempts, leased %v, due %v; want retry, 0, false, true",
				when, status, attempts, leased, due)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	ds, err := b.Receive(rctx, q, 10)
	cancel()
	if err != nil {
		t.Fatalf("Receive of a claim with one undecodable row: %v; want the others delivered", err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, string(d.Message().Body))
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"good 1", "good 2"}) {
		t.Errorf("delivered %q; want the two healthy jobs", got)
	}
	handedBack("after a claim that also took healthy jobs")
	if recs, _ := logs.matching(undecodableLog); len(recs) != 1 || attr(recs[0], "job_id").Int64() != badID {
		t.Errorf("logs of the undecodable job: %v; want one for job %d", recs, badID)
	}

	// Claimed alone, it is handed back again, and Receive says why.
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	ds, err = b.Receive(rctx, q, 10)
	cancel()
	var de *postgres.DecodeError
	if len(ds) != 0 || !errors.As(err, &de) || de.Queue != q || !slices.Equal(de.JobIDs, []int64{badID}) {
		t.Fatalf("Receive of the undecodable job alone: %d deliveries, %v; want a *postgres.DecodeError for job %d", len(ds), err, badID)
	}
	var argErr pgx.ScanArgError
	if !errors.As(err, &argErr) || argErr.FieldName != "first_failure_at" {
		t.Errorf("DecodeError %v does not carry the column's scan error", err)
	}
	if errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("DecodeError %v wraps ErrUnavailable: retrying does not fix the row", err)
	}
	handedBack("after a claim that took only it")

	// Fixed by hand, it is delivered at its first attempt.
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET first_failure_at = NULL WHERE id = $1`, badID); err != nil {
		t.Fatal(err)
	}
	ds = receiveN(t, b, q, 1)
	if string(ds[0].Message().Body) != "bad" || ds[0].Attempt() != 1 {
		t.Errorf("fixed job delivered as %q at attempt %d; want \"bad\" at 1", ds[0].Message().Body, ds[0].Attempt())
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
