// Command outboxproducer publishes jobs in the transaction of the business
// change that calls for them, on any broker: sign-ups insert a user and,
// in the same transaction, a WelcomeEmail job through the outbox
// (sdk.TxPublisher); the relay publishes what committed to the broker. A
// sign-up whose transaction rolls back (an email already taken) publishes
// nothing.
//
//	go run ./examples/outboxproducer -postgres 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' -broker mem://
//	go run ./examples/outboxproducer -broker amqp://guest:guest@127.0.0.1:5672/
//
// With a postgres:// broker URL the broker could take part in the
// transaction itself (it is an sdk.TxPublisher too); the outbox is the way
// for every broker. The demo works in a schema of its own, dropped at the end
// (Ctrl-C or SIGTERM included).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/examples/internal/demodb"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// Queue receives the welcome emails.
const Queue = "emails"

// WelcomeEmail is the job each sign-up publishes.
type WelcomeEmail struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// Kind names the job type.
func (WelcomeEmail) Kind() string { return "email.welcome" }

// IdempotencyKey names the business operation: one welcome per user.
func (w WelcomeEmail) IdempotencyKey() string { return fmt.Sprintf("welcome:%d:v1", w.UserID) }

func main() {
	dsn := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN (the business database, holding the outbox)")
	url := flag.String("broker", "mem://", "broker URL (brokerurl schemes)")
	flag.Parse()
	// Ctrl-C or SIGTERM ends the demo with its schema dropped; a second one
	// kills it at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo(ctx, *dsn, *url, os.Stdout); err != nil {
		if ctx.Err() != nil { // say why: the signal, or the minute
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		log.Fatal(err)
	}
}

func demo(ctx context.Context, dsn, url string, out io.Writer) error {
	pool, schema, done, err := demodb.Open(ctx, dsn, "outbox_demo")
	if err != nil {
		return err
	}
	defer done()
	broker, err := brokerurl.Open(ctx, url, brokerurl.Options{})
	if err != nil {
		return err
	}
	defer broker.Close()
	return Run(ctx, pool, schema, broker, []string{"ada@example.com", "grace@example.com", "ada@example.com", "alan@example.com"}, out)
}

// Run signs up emails (a taken one is refused, its transaction rolled back),
// relays the outbox to broker and prints the jobs the broker delivers.
func Run(ctx context.Context, pool *pgxpool.Pool, schema string, broker sdk.Broker, emails []string, out io.Writer) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS users (id bigserial PRIMARY KEY, email text NOT NULL UNIQUE)`); err != nil {
		return err
	}
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		return err
	}
	if err := box.Migrate(ctx); err != nil {
		return err
	}
	var pub sdk.TxPublisher[pgx.Tx] = box // any broker; a PostgreSQL broker could be used directly

	for _, email := range emails {
		err := SignUp(ctx, pool, pub, email)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "23505":
			fmt.Fprintf(out, "sign-up %s refused: email taken (rolled back, nothing published)\n", email)
		case err != nil:
			return err
		default:
			fmt.Fprintf(out, "signed up %s\n", email)
		}
	}

	if d, ok := broker.(sdk.QueueDeclarer); ok {
		if err := d.DeclareQueue(ctx, Queue); err != nil {
			return err
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	for {
		n, err := box.RelayOnce(ctx, broker, outbox.RelayOptions{Logger: quiet})
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		fmt.Fprintf(out, "relayed %d\n", n)
	}
	pending, err := box.Pending(ctx)
	if err != nil {
		return err
	}
	if pending != 0 {
		return fmt.Errorf("outboxproducer: %d rows left in the outbox", pending)
	}

	var want int // one job per committed user
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM users`).Scan(&want); err != nil {
		return err
	}
	received := 0
	for received < want {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ds, err := broker.Receive(rctx, Queue, want-received)
		cancel()
		if err != nil {
			return fmt.Errorf("outboxproducer: received %d of %d: %w", received, want, err)
		}
		for _, d := range ds {
			w, err := sdk.Decode[WelcomeEmail](d.Message())
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "broker delivered %s to %s (key %s)\n", d.Message().Type, w.Email, d.Message().IdempotencyKey)
			if err := d.Ack(ctx); err != nil {
				return err
			}
			received++
		}
	}
	if f, ok := broker.(sdk.Flusher); ok {
		return f.Flush(ctx)
	}
	return nil
}

// SignUp inserts the user and publishes its WelcomeEmail in one
// transaction: both happen or neither.
func SignUp(ctx context.Context, pool *pgxpool.Pool, pub sdk.TxPublisher[pgx.Tx], email string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO users (email) VALUES ($1) RETURNING id`, email).Scan(&id); err != nil {
			return err
		}
		m, err := sdk.NewJob(WelcomeEmail{UserID: id, Email: email})
		if err != nil {
			return err
		}
		return pub.PublishTx(ctx, tx, Queue, m)
	})
}
