package main

import (
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentServer returns the address of a TCP listener that accepts every
// connection and never answers (a hung PostgreSQL, RabbitMQ or NATS); the
// connections are closed at the end of the test.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestDoctorSilentBroker: a broker that accepts the connection and never
// answers made "berth doctor -check-timeout 2s" wait the 30 s every command
// gives the connection and then fail with a bare "cannot connect: context
// deadline exceeded", printing no finding. Opening the broker is now bounded
// by -check-timeout (or the run's -timeout, when sooner) and reported as a
// doctor.check-timeout error finding for -url, exit 1.
func TestDoctorSilentBroker(t *testing.T) {
	addr := silentServer(t)
	for _, u := range []string{"postgres://x@" + addr + "/db", "amqp://guest:guest@" + addr + "/", "nats://" + addr} {
		start := time.Now()
		r := doctorEnds(t, u, "billing", "-check-timeout", "2s", "-json")
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("doctor -check-timeout 2s on a silent broker (%s) took %s", u, took)
		}
		want := `{"id":"doctor.check-timeout","severity":"error","queue":"-url","summary":"the broker of -url did not answer within 2s: no check was run"`
		if r.code != exitError || !strings.Contains(r.out, want) || r.err != "" {
			t.Fatalf("doctor on a silent broker %s (exit %d): no %s in\n%s%s", u, r.code, want, r.out, r.err)
		}
		var d jsonDoctor
		if err := json.Unmarshal([]byte(r.out), &d); err != nil || len(d.Findings) != 1 {
			t.Fatalf("doctor on a silent broker %s: want one finding, got %v in\n%s", u, err, r.out)
		}
		// The connection's error (a context's or a read's timeout), without the password.
		if ev := d.Findings[0].Evidence; !strings.Contains(ev, "deadline exceeded") && !strings.Contains(ev, "i/o timeout") ||
			strings.Contains(ev, "guest:guest") {
			t.Errorf("doctor on a silent broker %s: evidence %q", u, ev)
		}
	}

	// The run's -timeout, when sooner, ends it and the finding says so.
	u := "postgres://x@" + addr + "/db"
	start := time.Now()
	r := doctorEnds(t, u, "-check-timeout", "1m", "-timeout", "2s")
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("doctor -timeout 2s on a silent broker took %s", took)
	}
	want := "error  doctor.check-timeout  -url: the broker of -url did not answer before doctor's overall deadline: no check was run"
	if r.code != exitError || !strings.Contains(r.out, want) || !strings.Contains(r.out, "1 checks: 1 errors, 0 warnings") {
		t.Fatalf("doctor -timeout 2s on a silent broker (exit %d): no %s in\n%s%s", r.code, want, r.out, r.err)
	}
}
