package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errOrderNotFound is a permanent failure: no retry creates the order.
var errOrderNotFound = errors.New("order not found")

// order is a row of the orders table (ARCHITECTURE.md, "Reference schema and
// the billing scenario").
type order struct {
	ID          string
	Status      string // pending | paid
	Version     int
	AmountCents int
	ChargedAt   time.Time // zero when not charged
}

// ledger holds orders and the charges applied to them. LoadForUpdate and
// Charge run inside the idempotency transaction found in ctx, so the charge,
// the order update and the job result commit together or not at all.
type ledger interface {
	Seed(ctx context.Context, orders []order) error
	LoadForUpdate(ctx context.Context, id string) (order, error)
	Charge(ctx context.Context, o order, key string) error
	ChargeCounts(ctx context.Context) (map[string]int, error)
}

// memLedger is the orders "table" in memory, with the same semantics: a
// row lock held until the transaction ends, writes applied at commit.
type memLedger struct {
	mu      sync.Mutex
	orders  map[string]*order
	locks   map[string]chan struct{}
	charges map[string]int
}

func newMemLedger() *memLedger {
	return &memLedger{orders: map[string]*order{}, locks: map[string]chan struct{}{}, charges: map[string]int{}}
}

func (l *memLedger) Seed(_ context.Context, orders []order) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range orders {
		o := o
		l.orders[o.ID] = &o
	}
	return nil
}

func (l *memLedger) lock(ctx context.Context, id string) error {
	for {
		l.mu.Lock()
		held, busy := l.locks[id]
		if !busy {
			l.locks[id] = make(chan struct{})
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (l *memLedger) unlock(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.locks[id])
	delete(l.locks, id)
}

func (l *memLedger) LoadForUpdate(ctx context.Context, id string) (order, error) {
	tx, ok := memstore.TxFrom(ctx)
	if !ok {
		return order{}, errors.New("memLedger: no transaction in context")
	}
	if err := l.lock(ctx, id); err != nil {
		return order{}, err
	}
	tx.OnEnd(func(bool) { l.unlock(id) })
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.orders[id]
	if !ok {
		return order{}, errOrderNotFound
	}
	return *o, nil
}

func (l *memLedger) Charge(ctx context.Context, o order, key string) error {
	tx, ok := memstore.TxFrom(ctx)
	if !ok {
		return errors.New("memLedger: no transaction in context")
	}
	tx.OnCommit(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		row := l.orders[o.ID]
		row.Status, row.ChargedAt, row.Version = "paid", time.Now(), row.Version+1
		l.charges[o.ID]++
	})
	return nil
}

func (l *memLedger) ChargeCounts(context.Context) (map[string]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]int, len(l.charges))
	for k, v := range l.charges {
		m[k] = v
	}
	return m, nil
}

// pgLedger is the orders and charges tables in PostgreSQL.
type pgLedger struct {
	pool            *pgxpool.Pool
	orders, charges string // quoted names
}

func newPGLedger(ctx context.Context, pool *pgxpool.Pool, schema string) (*pgLedger, error) {
	l := &pgLedger{pool: pool, orders: pgx.Identifier{schema, "orders"}.Sanitize(), charges: pgx.Identifier{schema, "charges"}.Sanitize()}
	ddl := `CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{schema}.Sanitize() + `;
CREATE TABLE IF NOT EXISTS ` + l.orders + ` (
    id           text PRIMARY KEY,
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid')),
    version      integer NOT NULL DEFAULT 0,
    amount_cents integer NOT NULL,
    charged_at   timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ` + l.charges + ` (
    id              bigserial PRIMARY KEY,
    order_id        text NOT NULL REFERENCES ` + l.orders + ` (id),
    idempotency_key text NOT NULL,
    amount_cents    integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return nil, fmt.Errorf("create billing tables: %w", err)
	}
	return l, nil
}

func (l *pgLedger) Seed(ctx context.Context, orders []order) error {
	b := &pgx.Batch{}
	for _, o := range orders {
		b.Queue(`INSERT INTO `+l.orders+` (id, amount_cents) VALUES ($1, $2)`, o.ID, o.AmountCents)
	}
	return l.pool.SendBatch(ctx, b).Close()
}

func (l *pgLedger) tx(ctx context.Context) (pgx.Tx, error) {
	tx, ok := pgstore.TxFrom(ctx)
	if !ok {
		return nil, errors.New("pgLedger: no transaction in context")
	}
	return tx, nil
}

func (l *pgLedger) LoadForUpdate(ctx context.Context, id string) (order, error) {
	tx, err := l.tx(ctx)
	if err != nil {
		return order{}, err
	}
	var (
		o       order
		charged *time.Time
	)
	err = tx.QueryRow(ctx, `SELECT id, status, version, amount_cents, charged_at FROM `+l.orders+` WHERE id = $1 FOR UPDATE`, id).
		Scan(&o.ID, &o.Status, &o.Version, &o.AmountCents, &charged)
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, errOrderNotFound
	}
	if err != nil {
		return order{}, err
	}
	if charged != nil {
		o.ChargedAt = *charged
	}
	return o, nil
}

func (l *pgLedger) Charge(ctx context.Context, o order, key string) error {
	tx, err := l.tx(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+l.charges+` (order_id, idempotency_key, amount_cents) VALUES ($1, $2, $3)`, o.ID, key, o.AmountCents); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE `+l.orders+` SET status = 'paid', charged_at = now(), version = version + 1, updated_at = now()
WHERE id = $1 AND version = $2 AND status = 'pending'`, o.ID, o.Version)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("order %s changed under its row lock (version %d)", o.ID, o.Version)
	}
	return nil
}

func (l *pgLedger) ChargeCounts(ctx context.Context) (map[string]int, error) {
	rows, err := l.pool.Query(ctx, `SELECT order_id, count(*) FROM `+l.charges+` GROUP BY order_id`)
	if err != nil {
		return nil, err
	}
	m := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		m[id] = n
	}
	return m, rows.Err()
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
