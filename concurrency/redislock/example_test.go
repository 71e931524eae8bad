package redislock_test

import (
	"context"
	"errors"
	"time"

	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// A charge handler that runs under a per-order lock and fences its database
// write with the lock's token. The lock only saves duplicate work; the fenced
// write (and, in a real handler, the idempotency key) keeps the effect right
// when the lock is lost.
func ExampleClient_Middleware() {
	var pool *pgxpool.Pool // the application's pool
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks, err := redislock.New(rdb, redislock.Options{TTL: 30 * time.Second, BusyDelay: 2 * time.Second})
	if err != nil {
		panic(err)
	}
	orders, err := fence.New(fence.Options{Table: "orders", TokenColumn: "fence_token"})
	if err != nil {
		panic(err)
	}
	charge := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		l, _ := redislock.FromContext(ctx)
		id := d.Message().Header("order_id")
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// Refused when a later lock holder already wrote this order.
			return orders.Update(ctx, tx, id, l.Token(), map[string]any{"status": "paid"})
		})
	})
	byOrder := func(m *sdk.Message) (string, error) {
		id := m.Header("order_id")
		if id == "" {
			return "", sdk.Permanent(errors.New("message names no order"))
		}
		return "order:" + id, nil
	}
	handler := sdk.Chain(charge, locks.Middleware(byOrder))
	_ = handler // run it in an sdk.Worker
}
