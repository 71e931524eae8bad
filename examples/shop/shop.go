package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// Queue is the queue both job types travel on.
const Queue = "shop"

// ReserveStock takes an order's items from the stock of its product. It is
// published by [Shop.PlaceOrder] in the order's transaction.
type ReserveStock struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// Kind names the job type.
func (ReserveStock) Kind() string { return "shop.reserve_stock" }

// IdempotencyKey names the business operation: one reservation per order,
// however many times the job is published or delivered.
func (r ReserveStock) IdempotencyKey() string { return "reserve:" + r.OrderID + ":v1" }

// SendConfirmation records the confirmation email of a reserved order. It is
// published by the ReserveStock handler in the reservation's transaction.
type SendConfirmation struct {
	OrderID string `json:"order_id"`
	Email   string `json:"email"`
}

// Kind names the job type.
func (SendConfirmation) Kind() string { return "shop.send_confirmation" }

// IdempotencyKey names the business operation: one confirmation per order.
func (c SendConfirmation) IdempotencyKey() string { return "confirm:" + c.OrderID + ":v1" }

// Schema is the shop's business tables. The idempotency results and the
// outbox have their own (pgstore and outbox Migrate).
const Schema = `
CREATE TABLE IF NOT EXISTS products (
    sku       text PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0),
    version   bigint  NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS orders (
    id      text PRIMARY KEY,
    sku     text    NOT NULL,
    qty     integer NOT NULL CHECK (qty > 0),
    email   text    NOT NULL,
    status  text    NOT NULL DEFAULT 'placed' -- placed, reserved, rejected, confirmed
);
CREATE TABLE IF NOT EXISTS sent_emails (
    id       bigserial PRIMARY KEY,
    order_id text NOT NULL,
    email    text NOT NULL
);`

// Shop is the service: its producers ([Shop.PlaceOrder]) and its handlers
// ([Shop.Router], to run under [Shop.Guard]).
//
// Every layer of berth has a part: typed jobs tie each handler to its
// payload; the PostgreSQL idempotency guard runs each handler in one
// transaction with its job's key, so a redelivered or republished job has
// its effect once; the stock is taken with an optimistic update (a version
// column, reloaded and retried on conflict) so concurrent orders never
// oversell; jobs are published through the outbox in the transaction of the
// change that calls for them; telemetry traces them from the order to the
// email and counts duplicates and version conflicts.
type Shop struct {
	pool     *pgxpool.Pool
	box      *outbox.Outbox
	store    *pgstore.Store
	pub      sdk.TxPublisher[pgx.Tx]
	products *optimistic.Table
	retrier  *optimistic.Retrier
	guard    *idempotency.Guard
	router   *sdk.Router
}

// NewShop wires the shop on pool, whose search_path holds its tables, with
// tel for telemetry.
func NewShop(pool *pgxpool.Pool, schema string, tel *telemetry.Observer, logger *slog.Logger) (*Shop, error) {
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		return nil, err
	}
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		return nil, err
	}
	products, err := optimistic.New(optimistic.Options{Table: "products", KeyColumn: "sku"})
	if err != nil {
		return nil, err
	}
	guard, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Transactional, Observer: tel.Idempotency(), Logger: logger})
	if err != nil {
		return nil, err
	}
	s := &Shop{
		pool: pool, box: box, store: store, products: products, guard: guard,
		pub:     telemetry.WrapTx[pgx.Tx](tel, box),
		retrier: &optimistic.Retrier{MaxAttempts: 10, OnConflict: tel.VersionConflictHook("products")},
		router:  sdk.NewRouter(),
	}
	sdk.HandleJob(s.router, s.reserveStock)
	sdk.HandleJob(s.router, s.sendConfirmation)
	return s, nil
}

// Migrate creates the shop's tables, the idempotency results and the outbox.
func (s *Shop) Migrate(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("shop schema: %w", err)
	}
	if err := s.store.Migrate(ctx); err != nil {
		return err
	}
	return s.box.Migrate(ctx)
}

// Router dispatches both job types; run it under [Shop.Guard].
func (s *Shop) Router() sdk.Handler { return s.router }

// Guard is the idempotency middleware the handlers need: it opens the
// transaction they write through and stores each job's key in it.
func (s *Shop) Guard() sdk.Middleware { return s.guard.Middleware() }

// Outbox is the outbox the shop publishes through; relay it to the broker.
func (s *Shop) Outbox() *outbox.Outbox { return s.box }

// AddProduct stocks available items of sku.
func (s *Shop) AddProduct(ctx context.Context, sku string, available int) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO products (sku, available) VALUES ($1, $2)`, sku, available)
	return err
}

// PlaceOrder records an order and, in the same transaction, publishes its
// ReserveStock job through the outbox: the job exists if and only if the
// order does.
func (s *Shop) PlaceOrder(ctx context.Context, orderID, sku string, qty int, email string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, sku, qty, email) VALUES ($1, $2, $3, $4)`, orderID, sku, qty, email); err != nil {
			return err
		}
		m, err := sdk.NewJob(ReserveStock{OrderID: orderID, SKU: sku, Qty: qty})
		if err != nil {
			return err
		}
		return s.pub.PublishTx(ctx, tx, Queue, m)
	})
}

// ErrNoTransaction reports a handler run without the idempotency guard.
var ErrNoTransaction = errors.New("shop: handler run without the idempotency guard's transaction")

// reserveStock takes the items from the product's stock with an optimistic
// update, marks the order reserved and publishes its confirmation, all in
// the guard's transaction; an order the stock cannot serve is rejected (a
// business outcome, acked). A product that does not exist is permanent.
func (s *Shop) reserveStock(ctx context.Context, j sdk.Job[ReserveStock]) error {
	tx, ok := pgstore.TxFrom(ctx)
	if !ok {
		return sdk.Permanent(ErrNoTransaction)
	}
	a := j.Args
	if a.Qty <= 0 {
		return sdk.Permanent(fmt.Errorf("order %s: quantity %d", a.OrderID, a.Qty))
	}
	reserved := false
	err := s.retrier.Do(ctx, func(ctx context.Context) error {
		var available int
		version, err := s.products.Get(ctx, tx, a.SKU, []string{"available"}, &available)
		if err != nil {
			return err
		}
		if available < a.Qty {
			reserved = false
			return nil
		}
		_, err = s.products.Update(ctx, tx, a.SKU, version, map[string]any{"available": available - a.Qty})
		reserved = err == nil
		return err
	})
	if err != nil {
		return err
	}
	if !reserved {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'rejected' WHERE id = $1`, a.OrderID)
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: a.OrderID})
		return err
	}
	var email string
	if err := tx.QueryRow(ctx, `UPDATE orders SET status = 'reserved' WHERE id = $1 RETURNING email`, a.OrderID).Scan(&email); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return sdk.Permanent(fmt.Errorf("order %s does not exist", a.OrderID))
		}
		return err
	}
	m, err := sdk.NewJob(SendConfirmation{OrderID: a.OrderID, Email: email})
	if err != nil {
		return err
	}
	idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: a.OrderID})
	return s.pub.PublishTx(ctx, tx, Queue, m)
}

// sendConfirmation records the email (standing in for the mail provider)
// and marks the order confirmed, in the guard's transaction: once per order.
func (s *Shop) sendConfirmation(ctx context.Context, j sdk.Job[SendConfirmation]) error {
	tx, ok := pgstore.TxFrom(ctx)
	if !ok {
		return sdk.Permanent(ErrNoTransaction)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sent_emails (order_id, email) VALUES ($1, $2)`, j.Args.OrderID, j.Args.Email); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE orders SET status = 'confirmed' WHERE id = $1 AND status = 'reserved'`, j.Args.OrderID)
	idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: j.Args.OrderID})
	return err
}

// Totals is the state of the shop's tables.
type Totals struct {
	Orders    map[string]int // by status
	Available map[string]int // stock left by sku
	Emails    int            // emails sent
	EmailDups int            // orders that got more than one email
}

// Totals reads the shop's state.
func (s *Shop) Totals(ctx context.Context) (Totals, error) {
	t := Totals{Orders: map[string]int{}, Available: map[string]int{}}
	rows, err := s.pool.Query(ctx, `SELECT status, count(*) FROM orders GROUP BY status`)
	if err != nil {
		return t, err
	}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return t, err
		}
		t.Orders[st] = n
	}
	if err := rows.Err(); err != nil {
		return t, err
	}
	rows, err = s.pool.Query(ctx, `SELECT sku, available FROM products`)
	if err != nil {
		return t, err
	}
	for rows.Next() {
		var sku string
		var n int
		if err := rows.Scan(&sku, &n); err != nil {
			return t, err
		}
		t.Available[sku] = n
	}
	if err := rows.Err(); err != nil {
		return t, err
	}
	err = s.pool.QueryRow(ctx, `SELECT count(*), count(*) - count(DISTINCT order_id) FROM sent_emails`).Scan(&t.Emails, &t.EmailDups)
	return t, err
}
