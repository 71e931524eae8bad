package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

func runUI(ctx context.Context, c *cli, args []string) error {
	if len(args) != 0 {
		return usagef("ui takes no arguments (queues go in -queues)")
	}
	if c.requestTimeout <= 0 {
		return usagef("-request-timeout must be positive")
	}
	token := c.token
	if token == "" {
		token = c.getenv("BERTH_UI_TOKEN")
	}
	// A short token is guessed by whoever can reach the address; refused
	// on loopback too (a token given is one relied on). No token is
	// fine there: then only loopback hosts are answered.
	if token != "" && len(token) < dashboard.MinTokenLength {
		return usagef("the token (-token or BERTH_UI_TOKEN) has %d bytes; it needs at least %d bytes, e.g. BERTH_UI_TOKEN=$(openssl rand -hex 16), "+
			"so that it cannot be guessed", len(token), dashboard.MinTokenLength)
	}
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return usagef("-addr: want host:port, e.g. 127.0.0.1:8080")
	}
	if !isLoopback(host) && token == "" {
		return usagef("refusing to serve on %s without a token: anyone who can reach it could redrive and purge; set BERTH_UI_TOKEN (or -token), or listen on 127.0.0.1", esc(c.addr))
	}
	if c.demo && !strings.HasPrefix(strings.ToLower(c.url), "mem:") {
		return usagef("-demo seeds made-up messages and works with mem:// only")
	}
	tlsConfig, err := c.uiTLS()
	if err != nil {
		return err
	}
	b, err := c.broker(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	if c.demo {
		if err := seedDemo(ctx, b); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, nil))
	o := dashboard.Options{ReadOnly: c.readOnly, Token: token, Title: redactedURL(c.url), Logger: logger, Timeout: c.requestTimeout}
	for _, q := range strings.Split(c.queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			o.Queues = append(o.Queues, q)
		}
	}
	// Job pages: the ledger's tables in -db (BERTH_DB) when given; else, on
	// the PostgreSQL broker, its jobs table, which is the ledger.
	if c.db != "" || c.getenv("BERTH_DB") != "" {
		// A schema without a ledger table serves the other pages (the
		// pauses may live there without a ledger); a schema that does not
		// exist is a mistyped -schema: refused before anything is created.
		jobs, closeJobs, err := c.openLedger(ctx)
		var missing *ledgerMissing
		switch {
		case errors.As(err, &missing) && missing.schemaFound:
			fmt.Fprintf(c.stderr, "berth ui: %s; serving without job pages\n", missing.msg)
		case err != nil:
			return err
		default:
			defer closeJobs()
			o.Jobs = jobs
		}
		// Queue pauses: the pause table in the same database (pause.Sync);
		// read-only, it is not created (the database may be a replica).
		use := pauseUI
		if c.readOnly {
			use = pauseUIReadOnly
		}
		pauses, closePauses, err := c.openPause(ctx, use)
		if err != nil {
			return err
		}
		defer closePauses()
		if pauses != nil {
			o.Pauses = pauses
		}
	} else {
		var pb *postgres.Broker
		var pool *pgxpool.Pool
		if as, ok := b.(interface{ As(any) bool }); ok && as.As(&pb) && as.As(&pool) {
			if jobs, err := pgledger.NewJobs(pool, pb.Schema()); err == nil {
				o.Jobs = jobs
			}
		}
	}
	d, err := dashboard.New(b, o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	var h http.Handler = d
	if token == "" {
		h = loopbackHostOnly(d)
	}
	// Every request in hand is waited for before the broker is closed
	// (deferred above): a redrive or purge under way when berth ui stops
	// finishes the page it is moving, and the dashboard logs what it did.
	// A request that comes once the wait has begun is turned away (see
	// requestGate).
	var inFlight requestGate
	next := h
	h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !inFlight.enter() {
			w.Header().Set("Connection", "close")
			http.Error(w, "berth ui is stopping", http.StatusServiceUnavailable)
			return
		}
		defer inFlight.leave()
		next.ServeHTTP(w, r)
	})
	defer inFlight.stopAndWait()
	// IdleTimeout: without it (and without ReadTimeout, which would cut a
	// long redrive) an idle keep-alive connection is kept for ever, and
	// anyone who can reach the address, token or not, could hold them
	// until the process runs out of files.
	// ReadHeaderTimeout bounds the TLS handshake too.
	// ErrorLog: failed TLS handshakes (port scans, TCP health checks,
	// plain HTTP to the HTTPS port) are counted, not logged one by one
	// (see uiErrorLog); other server errors are logged at WARN.
	errLog := &uiErrorLog{log: slog.NewLogLogger(logger.Handler(), slog.LevelWarn), now: uiNow, every: uiHandshakeLogEvery}
	defer errLog.flush()
	var conns uiConns
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: uiIdleTimeout,
		TLSConfig: tlsConfig, ErrorLog: log.New(errLog, "", 0), ConnState: conns.track}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	} else if !isLoopback(host) {
		fmt.Fprintf(c.stderr, "berth ui: WARNING: serving on %s without TLS: the token and every page cross the network in clear text, "+
			"for anyone on the path to read (and the token to replay); give -tls-cert and -tls-key, or put a TLS proxy in front and listen on 127.0.0.1\n", esc(c.addr))
	}
	fmt.Fprintf(c.stderr, "berth ui: serving %s://%s/%s (Ctrl-C to stop)\n", scheme, ln.Addr(), map[bool]string{true: " read-only", false: ""}[c.readOnly])
	if c.listening != nil {
		c.listening(ln.Addr().String())
	}
	done := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			done <- srv.ServeTLS(ln, "", "") // the certificate is in TLSConfig
			return
		}
		done <- srv.Serve(ln)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uiShutdownGrace)
	defer cancel()
	// Shutdown closes the listener and the idle keep-alive connections,
	// then waits for the others; but it counts as busy a connection on
	// which no request has come yet (a browser opens one ahead) for 5 s,
	// and an idle HTTP/2 one until it has said goodbye. Those are closed
	// here and now: the grace is for the requests in hand only.
	conns.stop()
	err = srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		// Connections still busy after the grace: close them, which ends
		// their requests' contexts; a redrive or purge then stops after
		// the page in hand (each broker call has dlq.PageTimeout), and the
		// deferred Wait holds the broker open until it has. Only requests
		// in hand are worth a line (not a response to a slow reader).
		if n := inFlight.inHand(); n > 0 {
			fmt.Fprintf(c.stderr, "berth ui: requests still running after %v (%d in hand); stopping them after their current broker call\n", uiShutdownGrace, n)
		}
		_ = srv.Close()
		err = nil
	}
	return err
}

// uiTLS returns the TLS configuration of -tls-cert and -tls-key, nil
// without them. Both or neither: one alone is a usage error; a file that
// cannot be read, or a key that does not match the certificate, an error
// (before the broker is opened). The files are read once: a renewed
// certificate is served after a restart.
func (c *cli) uiTLS() (*tls.Config, error) {
	switch {
	case c.tlsCert == "" && c.tlsKey == "":
		return nil, nil
	case c.tlsCert == "":
		return nil, usagef("-tls-key needs -tls-cert (the certificate's PEM file, its chain after it)")
	case c.tlsKey == "":
		return nil, usagef("-tls-cert needs -tls-key (the private key's PEM file)")
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert %s, -tls-key %s: %w", esc(c.tlsCert), esc(c.tlsKey), err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// requestGate counts the requests in hand of berth ui so that it closes
// the broker only after them, and turns away those that come once it has
// begun to wait. A sync.WaitGroup does not do: after the server's Close
// (the requests in hand outlived the grace), an HTTP/2 connection still
// runs the handlers of the requests it read before, each on a goroutine
// of its own that may start only after the wait began (an Add from zero
// concurrent with Wait, which WaitGroup forbids: a panic, or a handler
// using the broker after it was closed).
type requestGate struct {
	mu      sync.Mutex
	n       int
	stopped bool
	idle    chan struct{} // closed once stopped with none in hand
}

// enter counts a request in, or reports false once stopAndWait was called.
func (g *requestGate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.n++
	return true
}

// leave counts out a request that entered.
func (g *requestGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.stopped && g.n == 0 {
		close(g.idle)
	}
}

// inHand returns the number of requests in hand.
func (g *requestGate) inHand() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// stopAndWait turns away the requests to come and waits for those in hand.
func (g *requestGate) stopAndWait() {
	g.mu.Lock()
	g.stopped = true
	if g.n == 0 {
		g.mu.Unlock()
		return
	}
	g.idle = make(chan struct{})
	idle := g.idle
	g.mu.Unlock()
	<-idle
}

// uiConns tracks berth ui's connections (http.Server.ConnState) so that,
// once it stops, those without a request in hand are closed at once:
// http.Server.Shutdown closes the idle HTTP/1 ones, but takes one on which
// nothing was read yet (StateNew: a browser's pre-opened connection) for a
// busy one for 5 s, and an HTTP/2 one, which its server reports idle
// through the hook only, for busy until it has sent GOAWAY and waited.
// Without this, such a connection held Ctrl-C for the whole grace, which
// then said requests were running when none was.
type uiConns struct {
	mu       sync.Mutex
	stopping bool
	idle     map[net.Conn]struct{} // in StateNew or StateIdle
}

// track is the server's ConnState hook.
func (t *uiConns) track(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[net.Conn]struct{}{}
	}
	quiet := st == http.StateNew || st == http.StateIdle
	closeNow := quiet && t.stopping
	if quiet && !closeNow {
		t.idle[c] = struct{}{}
	} else {
		delete(t.idle, c)
	}
	t.mu.Unlock()
	if closeNow {
		_ = c.Close()
	}
}

// stop closes the connections without a request in hand, and from now on
// each as soon as it has none.
func (t *uiConns) stop() {
	t.mu.Lock()
	t.stopping = true
	quiet := make([]net.Conn, 0, len(t.idle))
	for c := range t.idle {
		quiet = append(quiet, c)
	}
	clear(t.idle)
	t.mu.Unlock()
	for _, c := range quiet {
		_ = c.Close()
	}
}

// handshakeErrorPrefix starts the line net/http logs for each failed TLS
// handshake.
const handshakeErrorPrefix = "http: TLS handshake error from "

// uiErrorLog is the writer of berth ui's http.Server.ErrorLog. A line goes
// to log (slog's, at WARN), except a failed TLS handshake: with -tls-cert
// every port scan, TCP health check or plain HTTP request to the HTTPS port
// makes one, which the operator can neither stop nor act on. The first is
// logged; the others are counted, and logged at most once every every as
// one line with their count and the latest of them (flush logs the count
// left at the end).
type uiErrorLog struct {
	log   *log.Logger
	now   func() time.Time
	every time.Duration

	mu     sync.Mutex
	logged time.Time // when a handshake line was last logged; zero: never
	muted  int       // failed handshakes since, not logged
	since  time.Time // the first of them
	latest string    // the latest of them, after the prefix
}

// Write logs the line p (a log.Logger writes one line per call).
func (l *uiErrorLog) Write(p []byte) (int, error) {
	line := strings.TrimSuffix(string(p), "\n")
	rest, handshake := strings.CutPrefix(line, handshakeErrorPrefix)
	if !handshake {
		l.log.Print(line)
		return len(p), nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.logged.IsZero() && now.Sub(l.logged) < l.every {
		if l.muted == 0 {
			l.since = now
		}
		l.muted++
		l.latest = rest
		return len(p), nil
	}
	if l.muted == 0 {
		l.log.Printf("%s (more are counted, and logged at most once every %s)", line, l.every)
	} else {
		l.muted++
		l.latest = rest
		l.summary()
	}
	l.logged = now
	return len(p), nil
}

// summary logs the failed handshakes counted; l.mu is held.
func (l *uiErrorLog) summary() {
	l.log.Printf("http: %d TLS handshake errors since %s (port scans, health checks, plain HTTP to the HTTPS port), the latest from %s",
		l.muted, l.since.UTC().Format(time.RFC3339), l.latest)
	l.muted = 0
}

// flush logs the failed handshakes counted and not logged yet.
func (l *uiErrorLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.muted > 0 {
		l.summary()
	}
}

// uiShutdownGrace is how long berth ui waits, once interrupted, for the
// requests in hand before it closes their connections; uiIdleTimeout is
// how long it keeps an idle keep-alive connection. Tests shorten them.
// uiHandshakeLogEvery is how often at most it logs the failed TLS
// handshakes it counted; uiNow is its clock.
var (
	uiShutdownGrace     = 5 * time.Second
	uiIdleTimeout       = 2 * time.Minute
	uiHandshakeLogEvery = time.Minute
	uiNow               = time.Now
)

// loopbackHostOnly refuses (403) a request whose Host is not a loopback
// name or address. Without a token the dashboard listens on loopback only,
// and this check is what keeps it there: a web page whose domain an
// attacker re-points at 127.0.0.1 (DNS rebinding) is, to the browser, the
// dashboard's own origin, so cross-origin protection lets its requests
// through; they still carry the attacker's name in Host.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host // no port
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if !isLoopback(host) && !strings.HasSuffix(strings.ToLower(host), ".localhost") {
			http.Error(w, "berth ui without a token answers only requests for a loopback host (127.0.0.1, [::1], localhost); "+
				"to reach it under another name set BERTH_UI_TOKEN (or -token)", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redactedURL is the broker URL to show: scheme, user, host and path; no
// password and no query (which may hold one). On nats:// a user without a
// password is no user but a token (nats.go authenticates with it as one),
// so it is left out too.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.User != nil {
		if _, pw := u.User.Password(); pw || !strings.EqualFold(u.Scheme, "nats") {
			r.User = url.User(u.User.Username())
		}
	}
	if r.Host == "" && r.Path == "" {
		return r.Scheme + "://"
	}
	return r.String()
}

// seedDemo fills a memory broker with a few queues and dead letters.
func seedDemo(ctx context.Context, b sdk.Broker) error {
	type dl struct {
		typ, body string
		cause     error
	}
	reasons := []dl{
		{"billing.charge", `{"order":"o-1041","amount_cents":1299,"currency":"EUR"}`, sdk.Permanent(errors.New("card declined: insufficient funds"))},
		{"billing.charge", `{"order":"o-1042","amount_cents":4500,"currency":"EUR"}`, errors.New("payment gateway timeout after 10s")},
		{"billing.refund", `{"order":"o-0977","amount_cents":1299}`, sdk.Permanent(errors.New("refund exceeds captured amount"))},
		{"billing.charge", `{"order":"o-1043","amount_cents":780,"currency":"USD"}`, errors.New("payment gateway timeout after 10s")},
		{"billing.charge", "\x00\x01binary\xff", sdk.Permanent(errors.New("undecodable body: invalid character"))},
		{"billing.invoice", `{"order":"o-1044"}`, errors.New("pdf renderer: connection refused")},
		{"billing.charge", `{"order":"o-1045","note":"\u001b[31mred\u001b[0m"}`, sdk.Permanent(errors.New("validation: note has control characters \x1b[31m"))},
	}
	for _, r := range reasons {
		if err := b.Publish(ctx, "billing", &sdk.Message{Type: r.typ, Body: []byte(r.body)}); err != nil {
			return err
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			return fmt.Errorf("demo: receive: %v", err)
		}
		if err := ds[0].DeadLetter(ctx, r.cause); err != nil {
			return err
		}
	}
	for i := range 42 {
		if err := b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: fmt.Appendf(nil, `{"order":"o-2%03d"}`, i)}); err != nil {
			return err
		}
	}
	for i := range 7 {
		if err := b.Publish(ctx, "emails", &sdk.Message{Type: "email.send", Body: fmt.Appendf(nil, `{"to":"user%d@example.com"}`, i)}); err != nil {
			return err
		}
	}
	if err := b.Publish(ctx, "reports", &sdk.Message{Type: "report.daily", Body: []byte(`{}`), Delay: time.Hour}); err != nil {
		return err
	}
	ds, err := b.Receive(ctx, "emails", 2) // two in flight
	_ = ds
	return err
}
