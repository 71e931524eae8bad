package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// The queue verbs record pauses in the pause table of -db (package pause):
// every Worker that runs pause.Sync stops receiving from a paused queue
// within its sync interval. The broker is not touched.

// openPause opens the pause table of -db (default $BERTH_DB) in -schema.
// With create it creates the table when missing. Without, for what only
// reads the table ("queue paused", the read-only dashboard), it changes
// nothing, so that it works on a read-only replica or with a role that may
// not create schemas, and returns a nil *pause.PG when there is no table.
func (c *cli) openPause(ctx context.Context, create bool) (*pause.PG, func(), error) {
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
	exists := true
	switch {
	case err != nil:
	case create:
		err = s.Migrate(ctx)
	default:
		schema := c.schema
		if schema == "" {
			schema = pause.DefaultSchema
		}
		err = pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "paused_queues"}.Sanitize()).Scan(&exists)
	}
	if err != nil || !exists {
		pool.Close()
		if errors.Is(err, pause.ErrInvalidSchema) {
			return nil, nil, &usageError{err.Error()}
		}
		if err != nil {
			return nil, nil, err
		}
		return nil, func() {}, nil
	}
	return s, pool.Close, nil
}

type jsonPauseChange struct {
	Queue   string `json:"queue"`
	Paused  bool   `json:"paused"`
	Changed bool   `json:"changed"`
}

func runQueueChange(ctx context.Context, c *cli, args []string, paused bool) error {
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
	s, closeDB, err := c.openPause(ctx, true)
	if err != nil {
		return err
	}
	defer closeDB()
	for i, q := range args {
		var changed bool
		if paused {
			changed, err = s.Pause(ctx, q)
		} else {
			changed, err = s.Resume(ctx, q)
		}
		if err != nil {
			if i == 0 {
				return err
			}
			// The queues before it were done (and printed): a partial change.
			verb := map[bool]string{true: "pause", false: "resume"}[paused]
			return &partialError{msg: fmt.Sprintf("%s %s: %v; the %d queue(s) before it were done, the %d from it on were not", verb, q, err, i, len(args)-i), err: err}
		}
		if c.json {
			if err := writeJSON(c.stdout, jsonPauseChange{Queue: q, Paused: paused, Changed: changed}); err != nil {
				return err
			}
			continue
		}
		switch {
		case paused && changed:
			fmt.Fprintf(c.stdout, "%s paused: synced Workers stop receiving from it within their sync interval\n", esc(q))
		case paused:
			fmt.Fprintf(c.stdout, "%s was paused already\n", esc(q))
		case changed:
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
	s, closeDB, err := c.openPause(ctx, false)
	if err != nil {
		return err
	}
	defer closeDB()
	var ps []pause.Paused
	if s != nil { // no table: nothing was ever paused here
		if ps, err = s.Paused(ctx); err != nil {
			return err
		}
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
