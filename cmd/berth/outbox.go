package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// The outbox verbs work on the parked rows of a transactional outbox table
// (package outbox): rows the relay gave up on after its MaxAttempts.

// openOutbox opens the outbox table of -db (default $BERTH_DB) and -table.
func (c *cli) openOutbox(ctx context.Context) (*outbox.Outbox, func(), error) {
	dsn := c.db
	if dsn == "" {
		dsn = c.getenv("BERTH_DB")
	}
	if dsn == "" {
		return nil, nil, usagef("no database: give -db postgres://… or set BERTH_DB")
	}
	o := outbox.Options{}
	if c.table != "" {
		schema, table, ok := strings.Cut(c.table, ".")
		if !ok {
			schema, table = "", schema
		}
		o.Schema, o.Table = schema, table
	}
	pool, err := c.openDBFor(ctx, dsn, "outbox")
	if err != nil {
		return nil, nil, err
	}
	box, err := outbox.New(pool, o)
	if err != nil {
		pool.Close()
		if errors.Is(err, outbox.ErrInvalidIdentifier) {
			return nil, nil, &usageError{err.Error()}
		}
		return nil, nil, err
	}
	return box, pool.Close, nil
}

type jsonParked struct {
	ID        int64       `json:"id"`
	Queue     string      `json:"queue"`
	Attempts  int         `json:"attempts"`
	LastError string      `json:"last_error"`
	CreatedAt time.Time   `json:"created_at"`
	ParkedAt  time.Time   `json:"parked_at"`
	Message   dlq.Message `json:"message"`
}

type jsonParkedList struct {
	Total int          `json:"total"`
	Rows  []jsonParked `json:"rows"`
}

func runOutboxList(ctx context.Context, c *cli, args []string) error {
	if len(args) != 0 {
		return usagef("outbox list takes no arguments")
	}
	box, closeBox, err := c.openOutbox(ctx)
	if err != nil {
		return err
	}
	defer closeBox()
	rows, err := box.Parked(ctx, 0) // parked rows are few: the relay parks a row only after every attempt failed
	if err != nil {
		return err
	}
	limit := c.limit
	if limit == 0 {
		limit = 50
	}
	shown := rows[:min(len(rows), limit)]
	if c.json {
		v := jsonParkedList{Total: len(rows), Rows: make([]jsonParked, 0, len(shown))}
		for _, p := range shown {
			v.Rows = append(v.Rows, jsonParked{p.ID, p.Queue, p.Attempts, p.LastError, p.CreatedAt, p.ParkedAt, dlq.View(p.Message)})
		}
		if err := writeJSON(c.stdout, v); err != nil {
			return err
		}
	} else {
		if len(shown) > 0 {
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tQUEUE\tTYPE\tATTEMPTS\tPARKED\tLAST ERROR")
			for _, p := range shown {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", p.ID, oneLine(p.Queue, 30), oneLine(p.Message.Type, 40), p.Attempts,
					p.ParkedAt.UTC().Format(time.RFC3339), oneLine(p.LastError, 80))
			}
			_ = tw.Flush()
		}
		fmt.Fprintf(c.stdout, "%d parked row(s)", len(rows))
		if len(shown) < len(rows) {
			fmt.Fprintf(c.stdout, ", %d shown (-limit)", len(shown))
		}
		fmt.Fprintln(c.stdout)
	}
	if len(rows) == 0 {
		return fmt.Errorf("no parked rows: %w", errNothing)
	}
	return nil
}

// runOutboxChange requeues or discards parked rows: the ids given, or all.
func runOutboxChange(ctx context.Context, c *cli, args []string, discard bool) error {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return usagef("row ids are integers (from berth outbox list), not %q", esc(a))
		}
		ids = append(ids, id)
	}
	verb, done := "requeue", "requeued"
	if discard {
		verb, done = "discard", "discarded"
	}
	box, closeBox, err := c.openOutbox(ctx)
	if err != nil {
		return err
	}
	defer closeBox()
	if c.dryRun || !c.yes {
		rows, err := box.Parked(ctx, 0)
		if err != nil {
			return err
		}
		n, missing := len(rows), []int64(nil)
		if len(ids) > 0 {
			parked := map[int64]bool{}
			for _, p := range rows {
				parked[p.ID] = true
			}
			n = 0
			for _, id := range ids {
				if parked[id] {
					n++
				} else {
					missing = append(missing, id)
				}
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not parked rows: %v (nothing changed): %w", missing, sdk.ErrNotFound)
		}
		if n == 0 {
			return fmt.Errorf("no parked rows: %w", errNothing)
		}
		if c.dryRun {
			fmt.Fprintf(c.stdout, "dry run: would %s %d parked row(s); nothing changed\n", verb, n)
			return nil
		}
		q := fmt.Sprintf("%s %d parked row(s) (the relay publishes them again)?", verb, n)
		if discard {
			q = fmt.Sprintf("discard %d parked row(s) (their messages are never published)?", n)
		}
		if err := c.confirm(q); err != nil {
			return err
		}
	}
	var n int
	if discard {
		n, err = box.Discard(ctx, ids...)
	} else {
		n, err = box.Requeue(ctx, ids...)
	}
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, map[string]any{"action": verb, "done": n})
	}
	fmt.Fprintf(c.stdout, "%s %d parked row(s)\n", done, n)
	if n == 0 {
		return fmt.Errorf("no parked rows: %w", errNothing)
	}
	return nil
}
