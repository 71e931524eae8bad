package main

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
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

// TestDoctorSilentBrokerChecksDBAndRedis: with a broker (-url) that accepts
// the connection and never answers, "berth doctor -db … -redis …" reported
// the broker's doctor.check-timeout and nothing else: the ledger, the
// idempotency result store and the dedupe cache, which an operator
// diagnosing the outage needs most, were not checked, as their checks ran
// inside doctor.Run, which needs the broker. They now run without it
// (doctor.RunStores), their findings beside the broker's; exit 1 (the
// broker's finding is an error).
func TestDoctorSilentBrokerChecksDBAndRedis(t *testing.T) {
	dsn, schema := storesToCheck(t)
	u := "postgres://x@" + silentServer(t) + "/db"
	r := doctorEnds(t, u, "billing", "-check-timeout", "2s", "-db", dsn, "-schema", schema, "-results-table", schema+".job_results",
		"-redis", integration.RedisAddr(t))
	for _, want := range []string{
		"error  doctor.check-timeout  -url: the broker of -url did not answer within 2s: no check of the broker (its queues, the Workers' options) was run, only those of -db and -redis",
		"warn   idempotency.claims-stuck  " + schema + ".job_results: ",
		"idempotency.retention  " + schema + ".job_results: ",
		"ok     ledger.retry-storm: ",
		"ledger.indexes  " + schema + ".ledger_jobs: ",
		"idempotency.dedupe-ttl",
	} {
		if r.code != exitError || !strings.Contains(r.out, want) || r.err != "" {
			t.Fatalf("doctor -db -redis on a silent broker (exit %d): no %q in\n%s%s", r.code, want, r.out, r.err)
		}
	}

	// -db without the ledger's tables: the finding says the ledger checks
	// were not run (there is no broker whose jobs table they could read).
	r = doctorEnds(t, u, "billing", "-check-timeout", "2s", "-db", dsn, "-schema", schema+"_none", "-json")
	var d jsonDoctor
	if err := json.Unmarshal([]byte(r.out), &d); err != nil || r.code != exitError {
		t.Fatalf("doctor -db -json on a silent broker (exit %d): %v\n%s%s", r.code, err, r.out, r.err)
	}
	var got []string
	for _, f := range d.Findings {
		got = append(got, f.ID+" "+f.Queue)
		if f.ID == "ledger.tables-missing" && !strings.Contains(f.Summary, "the ledger checks were not run") {
			t.Errorf("ledger.tables-missing without a broker: %q", f.Summary)
		}
	}
	for _, want := range []string{"doctor.check-timeout -url", "ledger.tables-missing " + schema + "_none.ledger_jobs", "idempotency.results-missing public.job_results"} {
		if !slices.Contains(got, want) {
			t.Errorf("doctor -db -json on a silent broker: no %s among %q", want, got)
		}
	}
	if d.Errors != 1 || d.Worst != doctor.Error {
		t.Errorf("doctor -db -json on a silent broker: %d errors, worst %s", d.Errors, d.Worst)
	}
}
