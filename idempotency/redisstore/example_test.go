package redisstore_test

import (
	"log"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// The cache sits in front of a durable store (pgstore in production): it
// answers most duplicates without a database round trip, and is written only
// after the store recorded success.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	cache, err := redisstore.New(rdb, redisstore.Options{Prefix: "billing:idem:"})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.Middleware(idempotency.Options{
		Store: memstore.New(memstore.Options{}), // the source of truth: pgstore.New(pool, …)
		Cache: cache,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = guard // worker options: sdk.WorkerOptions{Middleware: []sdk.Middleware{guard}}
}
