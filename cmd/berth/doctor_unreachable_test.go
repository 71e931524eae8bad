package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger/pgledger"
)

// closedPort returns 127.0.0.1:PORT where nothing listens: a port the
// system just gave a listener, closed again, so a connection is refused.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// storesToCheck migrates a ledger and a result store into a new schema of
// the test database, with a lease-mode claim stuck for an hour
// (idempotency.claims-stuck), and returns the DSN and the schema, which
// is dropped at the end of the test.
func storesToCheck(t *testing.T) (string, string) {
	t.Helper()
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	schema := fmt.Sprintf("cli_stores_%d", rand.Uint64()%1e12)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "job_results"}.Sanitize()+` (idempotency_key, status, owner_token, locked_until, expires_at)
		VALUES ('charge:order_lost:v1', 'in_progress', 'w1', now() - interval '1 hour', now() + interval '7 days')`); err != nil {
		t.Fatal(err)
	}
	return dsn, schema
}

// withUser returns rawURL with its user info replaced by user:password.
func withUser(t *testing.T, rawURL, user, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// TestDoctorBrokerUnreachable: a broker (-url) that refused the connection
// (nothing listening on its port), whose host name does not resolve, that
// refused the credentials or the vhost, or whose TLS handshake failed made
// "berth doctor -db … -redis …" exit 1 with a bare error on stderr: no
// finding, and neither the ledger, the result store nor the dedupe cache -
// what an operator needs most when the broker is down - was checked. It is
// now the error finding doctor.broker-unreachable on -url, with the error
// as evidence (never the password) and a fix that fits the failure, beside
// the findings of -db and -redis (doctor.RunStores); exit 1.
func TestDoctorBrokerUnreachable(t *testing.T) {
	dsn, schema := storesToCheck(t)
	redisAddr := integration.RedisAddr(t)
	const secret = "Sup3r-s3cret-pw" // must never be printed
	refused := closedPort(t)
	rabbit := integration.RabbitMQURL(t)
	wrongVhost, err := url.Parse(rabbit)
	if err != nil {
		t.Fatal(err)
	}
	wrongVhost.Path = fmt.Sprintf("/berth_no_such_vhost_%d", rand.Uint64()%1e12)
	for _, tc := range []struct {
		name, url    string
		checkTimeout string
		summary      string   // in the finding's summary
		evidence     []string // one of them in its evidence
		fix          string   // in its fix
	}{
		{"refused postgres", "postgres://x:" + secret + "@" + refused + "/db", "30s",
			"refused the connection", []string{"connection refused"}, "is running"},
		{"refused nats", "nats://u:" + secret + "@" + refused, "30s",
			"refused the connection", []string{"no servers available"}, "is running"},
		// RabbitMQ's client retries a refused connection until the deadline.
		{"refused rabbitmq", "amqp://guest:" + secret + "@" + refused + "/", "5s",
			"refused the connection", []string{"connection refused"}, "is running"},
		{"unknown host", "postgres://x:" + secret + "@berth-no-such-host.invalid/db", "30s",
			"could not be reached: its host name did not resolve", []string{"berth-no-such-host.invalid"}, "host name"},
		// RabbitMQ answers wrong credentials only after a few seconds.
		{"wrong rabbitmq password", withUser(t, rabbit, "guest", secret), "30s",
			"refused the credentials", []string{"403", "ACCESS_REFUSED", "not allowed"}, "user and password"},
		{"unknown postgres role", withUser(t, integration.PostgresDSN(t), "berth_no_such_role", secret), "30s",
			"refused the credentials", []string{"28000", "berth_no_such_role"}, "user and password"},
		{"unknown rabbitmq vhost", wrongVhost.String(), "30s",
			"refused the vhost or database", []string{"vhost", "530"}, "vhost"},
		{"nats without tls", integration.NATSURL(t) + "?tls=true", "30s",
			"TLS handshake", []string{"secure connection"}, "TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"billing", "-check-timeout", tc.checkTimeout, "-db", dsn, "-schema", schema,
				"-results-table", schema + ".job_results", "-redis", redisAddr}
			r := doctorEnds(t, tc.url, append(args, "-json")...)
			if strings.Contains(r.out+r.err, secret) {
				t.Fatalf("doctor on %s printed the password:\n%s%s", tc.name, r.out, r.err)
			}
			var d jsonDoctor
			if err := json.Unmarshal([]byte(r.out), &d); err != nil || r.code != exitError || r.err != "" {
				t.Fatalf("doctor -json on %s (exit %d): %v\n%s%s", tc.name, r.code, err, r.out, r.err)
			}
			got, ids := map[string]doctor.Finding{}, map[string]bool{}
			for _, f := range d.Findings {
				got[f.ID+" "+f.Queue], ids[f.ID] = f, true
			}
			f, ok := got["doctor.broker-unreachable -url"]
			if !ok || f.Severity != doctor.Error {
				t.Fatalf("doctor -json on %s: no doctor.broker-unreachable error finding on -url in\n%s", tc.name, r.out)
			}
			want := "no check of the broker (its queues, the Workers' options) was run, only those of -db and -redis"
			if !strings.Contains(f.Summary, tc.summary) || !strings.Contains(f.Summary, want) {
				t.Errorf("doctor on %s: summary %q, want %q and %q", tc.name, f.Summary, tc.summary, want)
			}
			if !containsAny(f.Evidence, tc.evidence) {
				t.Errorf("doctor on %s: evidence %q, want one of %q", tc.name, f.Evidence, tc.evidence)
			}
			if !strings.Contains(f.Fix, tc.fix) {
				t.Errorf("doctor on %s: fix %q, want %q", tc.name, f.Fix, tc.fix)
			}
			// The checks of -db and -redis ran beside it.
			for _, id := range []string{"idempotency.claims-stuck", "idempotency.retention", "ledger.retry-storm", "ledger.indexes", "idempotency.dedupe-ttl"} {
				if !ids[id] {
					t.Errorf("doctor -json on %s: no %s in\n%s", tc.name, id, r.out)
				}
			}
			if got["idempotency.claims-stuck "+schema+".job_results"].Severity != doctor.Warn || d.Worst != doctor.Error || d.Errors != 1 {
				t.Errorf("doctor -json on %s: worst %s, %d errors in\n%s", tc.name, d.Worst, d.Errors, r.out)
			}
			if tc.name != "unknown postgres role" && tc.name != "refused postgres" {
				return
			}
			// The text output, once per scheme family, for the lines an operator reads.
			r = doctorEnds(t, tc.url, args...)
			if strings.Contains(r.out+r.err, secret) {
				t.Fatalf("doctor on %s printed the password:\n%s%s", tc.name, r.out, r.err)
			}
			for _, want := range []string{"error  doctor.broker-unreachable  -url: the broker of -url " + tc.summary, "       evidence: ", "       fix: ",
				"warn   idempotency.claims-stuck  " + schema + ".job_results: "} {
				if r.code != exitError || !strings.Contains(r.out, want) || r.err != "" {
					t.Fatalf("doctor on %s (exit %d): no %q in\n%s%s", tc.name, r.code, want, r.out, r.err)
				}
			}
		})
	}

	// Without -db and -redis no other check runs, and the finding says so.
	r := doctorEnds(t, "postgres://x:"+secret+"@"+refused+"/db", "billing", "-json")
	var d jsonDoctor
	if err := json.Unmarshal([]byte(r.out), &d); err != nil || r.code != exitError || len(d.Findings) != 1 ||
		d.Findings[0].ID != "doctor.broker-unreachable" || !strings.HasSuffix(d.Findings[0].Summary, ": no check was run") {
		t.Fatalf("doctor -json on a refused broker alone (exit %d): %v\n%s%s", r.code, err, r.out, r.err)
	}
}

// TestDoctorBrokerURLUsageStays: a -url that is malformed or names an
// unknown scheme or parameter is still a usage error (exit 2), not a
// finding, even with -db and -redis given.
func TestDoctorBrokerURLUsageStays(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for _, u := range []string{"foo://host", "amqp:guest:secret@host", "postgres://x@" + closedPort(t) + "/db?lease=soon"} {
		r := doctorEnds(t, u, "billing", "-db", dsn, "-redis", integration.RedisAddr(t))
		if r.code != exitUsage || r.out != "" || r.err == "" || strings.Contains(r.err, "broker-unreachable") {
			t.Errorf("doctor -url %s (exit %d, want %d):\n%s%s", u, r.code, exitUsage, r.out, r.err)
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
