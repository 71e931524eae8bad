package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/internal/demotest"
)

// runMainEnv makes the test binary run the command's main instead of the
// tests (TestInterruptDropsSchema's child process).
const runMainEnv = "BERTH_OUTBOXPRODUCER_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestRun: the committed sign-ups' jobs reach the broker through the
// outbox, once each, with their keys; the refused one publishes nothing.
func TestRun(t *testing.T) {
	pool, schema := pgtest.Schema(t, 4)
	b := berthtest.Memory(t)
	var out bytes.Buffer
	if err := Run(context.Background(), pool, schema, b, []string{"a@example.com", "b@example.com", "a@example.com"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"signed up a@example.com", "signed up b@example.com",
		"sign-up a@example.com refused: email taken (rolled back, nothing published)",
		"broker delivered email.welcome to a@example.com (key welcome:1:v1)",
		"broker delivered email.welcome to b@example.com (key welcome:2:v1)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "broker delivered"); n != 2 {
		t.Errorf("%d deliveries, want 2:\n%s", n, got)
	}
	st, err := b.Stats(context.Background(), Queue)
	if err != nil || st.Ready+st.InFlight+st.Delayed != 0 {
		t.Errorf("queue left with %+v (%v)", st, err)
	}
}

// TestInterruptDropsSchema: Ctrl-C (SIGINT) while the demo waits for its
// broker (here one that takes the connection and never answers) ends it with
// an error, its schema dropped, as the command's doc promises ("dropped at
// the end"), instead of killing it with the schema left behind.
func TestInterruptDropsSchema(t *testing.T) {
	db, _ := pgtest.Schema(t, 2)
	dsn := db.Config().ConnString() // the database's, without the schema
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A broker that accepts connections and never answers: the demo waits
	// for it after creating its schema.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = ln.Close()
		<-accepting
		for _, c := range conns {
			_ = c.Close()
		}
	}()

	cmd := exec.Command(os.Args[0], "-postgres", dsn, "-broker", "amqp://guest:guest@"+ln.Addr().String()+"/")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	demotest.SignalDropsSchema(ctx, t, db, `^outbox_demo_`, cmd, os.Interrupt, "interrupt signal received")
}
