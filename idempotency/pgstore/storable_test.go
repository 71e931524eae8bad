package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
)

// A result that is valid JSON and a valid Go string but that PostgreSQL
// cannot store (jsonb refuses \u0000 and unpaired surrogate escapes; text
// refuses NUL bytes and invalid UTF-8) is refused by SetResult. Accepted, it
// made every Complete fail: the claim stayed in progress, expired, and the
// redelivery that took it over applied the effect again.
func TestUnstorableResultDoesNotReapplyEffect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, ClaimLease: 300 * time.Millisecond,
		Heartbeat: 100 * time.Millisecond, CleanupTimeout: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for name, res := range map[string]idempotency.Result{
		"json NUL escape":       {JSON: []byte(`{"reply":"a\u0000b"}`)},
		"json lone surrogate":   {JSON: []byte(`["\ud800"]`)},
		"json low surrogate":    {JSON: []byte(`"\udc00 x"`)},
		"json invalid UTF-8":    {JSON: []byte("{\"reply\":\"\xff\"}")},
		"json number too large": {JSON: []byte(`{"amount":1e131072}`)},
		"json number too fine":  {JSON: []byte(`[1.5e-16383]`)},
		"resource id NUL":       {ResourceType: "order", ResourceID: "o\x001"},
		"resource type invalid": {ResourceType: "ord\xe9r", ResourceID: "1"},
	} {
		t.Run(name, func(t *testing.T) {
			op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
			effects := 0
			for range 3 {
				_, err := g.Do(ctx, op, func(hctx context.Context) error {
					effects++ // the charge
					if idempotency.SetResult(hctx, res) {
						t.Error("SetResult accepted a result PostgreSQL cannot store")
					}
					return nil
				})
				if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
					t.Log(err)
				}
				time.Sleep(400 * time.Millisecond) // past the claim, as a redelivery's backoff
			}
			if effects != 1 {
				t.Errorf("effect applied %d times, want 1", effects)
			}
		})
	}
	// What PostgreSQL does store is still accepted: an escaped backslash
	// before "u0000", and a surrogate pair.
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	good := idempotency.Result{ResourceType: "order", ResourceID: "ö1", JSON: []byte(`{"a":"\\u0000","b":"\ud83d\ude00"}`)}
	if _, err := g.Do(ctx, op, func(hctx context.Context) error {
		if !idempotency.SetResult(hctx, good) {
			t.Error("SetResult refused a storable result")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(ctx, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result.ResourceID != "ö1" || !strings.Contains(string(rec.Result.JSON), `\\u0000`) || !strings.Contains(string(rec.Result.JSON), "😀") {
		t.Errorf("stored result = %+v %s", rec.Result, rec.Result.JSON)
	}
}

// SetResult accepts exactly the JSON that jsonb stores, as PostgreSQL
// itself judges it: \u escapes (escaped backslashes, surrogate pairs in
// either case, lone or misordered surrogates) and numbers at the edges of
// numeric's range however they are written. A number jsonb refuses
// (1e131072, a passed-through upstream body) was accepted, and every
// completion then failed as for a \u0000.
func TestSetResultAgreesWithJSONB(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{
		`"\u0000"`, `"\\u0000"`, `"\\\u0000"`, `"\uD83D\uDE00"`, `"\ud83d\uDe00"`, `"\ud83d"`, `"\ude00"`,
		`"a\ud83d"`, `"\ud83dx"`, `"\ud83d\n"`, `"\ud83d\ud83d\ude00"`, `"\ude00\ud83d"`, `"\u00e9\u00E9"`,
		`1e131071`, `1e131072`, `9.9e131071`, `1E+131071`, `-1e131072`, `10e131070`, `10e131071`,
		`0.0001e131075`, `0.0001e131076`, `1e-16383`, `1e-16384`, `1.5e-16382`, `1.5e-16383`,
		`0e-16383`, `0e-16384`, `0.0e5`, `-0`, `0e999999999`, `0e1073741822`, `0e1073741823`,
		`1e99999999999999999999`, `1e-99999999999999999999`, `[1,2.5,-3e2]`,
		"1" + strings.Repeat("0", 131071), "1" + strings.Repeat("0", 131072),
		"0." + strings.Repeat("0", 16383), "0." + strings.Repeat("0", 16384),
		"0." + strings.Repeat("0", 16382) + "1", "0." + strings.Repeat("0", 16383) + "1",
		`{"1e999999":"1e999999","n":1}`, `["\"1e999999"]`, `{"a":[true,false,null,1e5]}`,
	}
	if _, err := g.Do(ctx, idempotency.Operation{Key: "k-" + randSuffix()}, func(hctx context.Context) error {
		for _, doc := range docs {
			var ignored string
			stored := e.pool.QueryRow(ctx, `SELECT $1::text::jsonb::text`, doc).Scan(&ignored) == nil
			if got := idempotency.SetResult(hctx, idempotency.Result{JSON: []byte(doc)}); got != stored {
				short := doc
				if len(short) > 40 {
					short = short[:40] + "…"
				}
				t.Errorf("SetResult(%s) = %v, jsonb stores it: %v", short, got, stored)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A key PostgreSQL cannot store — a NUL byte or invalid UTF-8 from a foreign
// producer or a webhook, a key too long for the unique index — or such a job
// type, is refused as a permanent error wrapping ErrInvalidKey, and the
// operation does not run. It was an untyped error that the worker retried
// until the message's attempts ran out, and that an inbox's caller (a
// webhook sender) retried forever.
func TestUnstorableKeyIsPermanent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	long := make([]byte, 12000)
	_, _ = rand.Read(long)
	for _, mode := range []idempotency.Mode{idempotency.Lease, idempotency.Transactional} {
		g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: mode, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		for name, op := range map[string]idempotency.Operation{
			"NUL in key":         {Key: "charge:\x00" + randSuffix(), JobType: "t", Fingerprint: "fp"},
			"invalid UTF-8 key":  {Key: "charge:\xff" + randSuffix(), JobType: "t", Fingerprint: "fp"},
			"key too long":       {Key: base64.StdEncoding.EncodeToString(long), JobType: "t", Fingerprint: "fp"},
			"NUL in job type":    {Key: "k-" + randSuffix(), JobType: "t\x00", Fingerprint: "fp"},
			"invalid UTF-8 type": {Key: "k-" + randSuffix(), JobType: "payment\xe9", Fingerprint: "fp"},
			"NUL in fingerprint": {Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "\x00"},
		} {
			ran := false
			_, err := g.Do(ctx, op, func(context.Context) error { ran = true; return nil })
			if !sdk.IsPermanent(err) || !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Errorf("%s, %s: Do = %v, want a permanent ErrInvalidKey", mode, name, err)
			}
			if ran {
				t.Errorf("%s, %s: the operation ran", mode, name)
			}
		}
		// An inbox event whose type came in as Latin-1 from a webhook.
		_, err = g.Inbox().Process(ctx, idempotency.InboxEvent{Source: "shop", ID: randSuffix(), Type: "commande.pay\xe9e"},
			func(context.Context) error { return nil })
		if !sdk.IsPermanent(err) || !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("%s: inbox Process = %v, want a permanent ErrInvalidKey", mode, err)
		}
	}
	// The store is still usable, and the error names no key.
	_, err := e.store.Get(ctx, "absent-"+randSuffix())
	if !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get = %v", err)
	}
	g, _ := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, Logger: quiet})
	_, err = g.Do(ctx, idempotency.Operation{Key: "secret-customer\x00", JobType: "t"}, func(context.Context) error { return nil })
	if err == nil || strings.Contains(err.Error(), "secret-customer") {
		t.Errorf("error = %v, want one that names the key by its digest", err)
	}
}

// TestGetUnstorableKeyNotFound: Get of a key PostgreSQL cannot hold (a NUL
// byte, invalid UTF-8), which Claim and Begin refuse with ErrInvalidKey, is
// not found — no row holds it — as Get of any other key that was never
// stored, and says why (ErrInvalidKey). It was an untyped error from the
// failed statement (SQLSTATE 22021), which a caller told transient from not
// found only by its text, and which aborted the transaction of a Store
// whose DB is a pgx.Tx.
func TestGetUnstorableKeyNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, key := range []string{"charge:\x00" + randSuffix(), "charge:\xff" + randSuffix()} {
		_, err := e.store.Get(ctx, key)
		if !errors.Is(err, idempotency.ErrNotFound) || !errors.Is(err, sdk.ErrNotFound) || !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("Get(%q) = %v; want ErrNotFound and ErrInvalidKey", key, err)
		}
		if err != nil && strings.Contains(err.Error(), "charge:") {
			t.Errorf("Get(%q) = %v; want the key named by its digest", key, err)
		}
	}
	// On a store whose DB is a transaction: the transaction is not aborted.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ts, err := pgstore.New(tx, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Get(ctx, "k\x00"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get in a transaction = %v; want ErrNotFound", err)
	}
	if _, err := ts.Get(ctx, "absent-"+randSuffix()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after it, in the same transaction = %v; want ErrNotFound (the transaction usable)", err)
	}
}
