package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// The queue verbs record pauses in the pause table of -db (package pause):
// every Worker that runs pause.Sync stops receiving from a paused queue
// within its sync interval. The broker is not touched.

// pauseUse is what openPause opens the pause table for.
type pauseUse int

const (
	// pauseChange (queue pause): the schema must exist; the table is
	// created in it when missing (the first pause).
	pauseChange pauseUse = iota
	// pauseExisting (queue resume, queue paused): the schema and the table
	// must exist; nothing is created.
	pauseExisting
	// pauseUI (berth ui): the schema and the table are created when
	// missing, as the Workers' processes do (pause.PG.Migrate).
	pauseUI
	// pauseUIReadOnly (berth ui -read-only): nothing is created, nor
	// written; a nil *pause.PG when there is no table.
	pauseUIReadOnly
)

// notFoundError is an error of the CLI that wraps sdk.ErrNotFound (exit 3)
// without its text.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

// Unwrap returns sdk.ErrNotFound.
func (e *notFoundError) Unwrap() error { return sdk.ErrNotFound }

// schemaTable reports whether schema exists in the database of pool, and
// table (quoted) in it: the CLI creates no schema, so a mistyped -schema
// is named rather than made.
func schemaTable(ctx context.Context, pool *pgxpool.Pool, schema, table string) (schemaFound, tableFound bool, err error) {
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1), to_regclass($2) IS NOT NULL`,
		schema, table).Scan(&schemaFound, &tableFound)
	return schemaFound, tableFound, err
}

// openPause opens the pause table of -db (default $BERTH_DB) in -schema,
// for use. The queue verbs create no schema: a -schema mistyped made
// "queue pause" create that schema and a table in it that no Worker reads,
// and report the pause done. A schema that does not exist is a named thing
// not found (exit 3), and so, for resume and paused, is a schema without
// the table (nothing was ever paused there). The first pause in a schema
// that exists creates the table (pause.PG.Migrate). What only reads ("queue
// paused", the read-only dashboard) changes nothing, so that it works on a
// read-only replica or with a role that may not create schemas.
func (c *cli) openPause(ctx context.Context, use pauseUse) (*pause.PG, func(), error) {
	dsn := c.db
	if dsn == "" {
		dsn = c.getenv("BERTH_DB")
	}
	if dsn == "" {
		return nil, nil, usagef("no database: give -db postgres://… or set BERTH_DB (where the Workers' pause.Sync reads)")
	}
	pool, err := c.openDB(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: c.schema})
	if err != nil {
		pool.Close()
		if errors.Is(err, pause.ErrInvalidSchema) {
			return nil, nil, &usageError{err.Error()}
		}
		return nil, nil, err
	}
	if use == pauseUI {
		if err := s.Migrate(ctx); err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	schema := c.schema
	if schema == "" {
		schema = pause.DefaultSchema
	}
	schemaFound, tableFound, err := schemaTable(ctx, pool, schema, pgx.Identifier{schema, "paused_queues"}.Sanitize())
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("pause table: %w", err)
	}
	switch {
	case tableFound:
	case use == pauseUIReadOnly:
		pool.Close()
		return nil, func() {}, nil // no table: nothing was ever paused here
	case !schemaFound:
		err = &notFoundError{fmt.Sprintf("schema \"%s\" does not exist in -db: no queue is paused there, and berth creates no schema "+
			"(give -schema the schema of the pause table the Workers' pause.Sync reads; pause.PG.Migrate creates it)", esc(schema))}
	case use == pauseExisting:
		err = &notFoundError{fmt.Sprintf("no pause table \"%s\".paused_queues in -db: no queue was ever paused in that schema "+
			"(is -schema the schema of the pause table the Workers' pause.Sync reads?)", esc(schema))}
	default: // pauseChange: the first pause in this schema
		err = s.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, pool.Close, nil
}

type jsonPauseChange struct {
	Queue   string `json:"queue"`
	Paused  bool   `json:"paused"`
	Changed bool   `json:"changed"`
}

// runQueueChange pauses or resumes the queues in args, one statement each,
// not cut by ctx: an interrupt (ctx done) is seen between two queues, so
// that what it reports done is what was done.
func runQueueChange(ctx context.Context, c *cli, args []string, paused bool) (err error) {
	changed := 0 // queues done; before the first, an interrupt changed nothing
	defer func() {
		if changed == 0 {
			err = interruptedBeforeChange(ctx, err)
		}
	}()
	if len(args) == 0 {
		return usagef("name the queues")
	}
	// Every name is checked before any change. Resume refuses only what
	// PostgreSQL cannot store, so that queues paused under older naming
	// rules can still be resumed.
	for _, q := range args {
		if paused {
			if err := sdk.ValidateQueueName(q); err != nil {
				return &usageError{err.Error()}
			}
		} else if !sqlident.StorableText(q) {
			return &usageError{(&sdk.QueueNameError{Name: q, Reason: "not text PostgreSQL can store"}).Error()}
		}
	}
	use := pauseExisting
	if paused {
		use = pauseChange
	}
	s, closeDB, err := c.openPause(ctx, use)
	if err != nil {
		return err
	}
	defer closeDB()
	verb := map[bool]string{true: "pause", false: "resume"}[paused]
	for i, q := range args {
		if err := ctx.Err(); err != nil {
			if i == 0 {
				return err
			}
			return &partialError{msg: fmt.Sprintf("interrupted (%v) before the %s of %s; the %d queue(s) before it were done, the %d from it on were not",
				err, verb, esc(q), i, len(args)-i), err: err}
		}
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlq.PageTimeout)
		var did bool
		if paused {
			did, err = s.Pause(qctx, q)
		} else {
			did, err = s.Resume(qctx, q)
		}
		cancel()
		if err != nil {
			if i == 0 {
				return err
			}
			// The queues before it were done (and printed): a partial change.
			return &partialError{msg: fmt.Sprintf("%s %s: %v; the %d queue(s) before it were done, the %d from it on were not", verb, esc(q), err, i, len(args)-i), err: err}
		}
		changed++
		if c.json {
			if err := writeJSON(c.stdout, jsonPauseChange{Queue: q, Paused: paused, Changed: did}); err != nil {
				return err
			}
			continue
		}
		switch {
		case paused && did:
			fmt.Fprintf(c.stdout, "%s paused: synced Workers stop receiving from it within their sync interval\n", esc(q))
		case paused:
			fmt.Fprintf(c.stdout, "%s was paused already\n", esc(q))
		case did:
			fmt.Fprintf(c.stdout, "%s resumed\n", esc(q))
		default:
			fmt.Fprintf(c.stdout, "%s was not paused\n", esc(q))
		}
	}
	return nil
}

type jsonPausedList struct {
	Queues []pause.Paused `json:"queues"`
}

func runQueuePaused(ctx context.Context, c *cli, args []string) error {
	if len(args) != 0 {
		return usagef("queue paused takes no arguments (it lists every paused queue)")
	}
	s, closeDB, err := c.openPause(ctx, pauseExisting)
	if err != nil {
		return err
	}
	defer closeDB()
	ps, err := s.Paused(ctx)
	if err != nil {
		return err
	}
	if c.json {
		if ps == nil {
			ps = []pause.Paused{}
		}
		return writeJSON(c.stdout, jsonPausedList{Queues: ps})
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPAUSED SINCE")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\n", esc(p.Queue), p.Since.UTC().Format(time.RFC3339))
	}
	if len(ps) == 0 {
		fmt.Fprintln(tw, "(no paused queues)")
	}
	return tw.Flush()
}
