// Package dashboard is berth's web dashboard: an http.Handler, rendered on
// the server from templates and assets embedded in the binary (no Node
// toolchain), over any broker. `berth ui` serves it; a program can mount it
// too.
//
// Pages: the queues overview (ready, delayed, in flight, dead-lettered,
// oldest age; refreshed live), a queue's dead letters (filter, page, select
// some or all matching, redrive or purge behind a confirmation that states
// the count), one dead letter (headers, body, failure history) and, with a
// [ledger.Reader], job state (one job by ID or idempotency key, lists by
// status). The same data is served as JSON under /api/.
//
// Security: with Options.Token (at least [MinTokenLength] bytes) every
// request must carry it (a bearer token, or the password of HTTP basic
// auth, which browsers ask for), and one that does not is answered 401 at
// once, a body it announced not waited for; a request that carried a wrong
// token is logged at WARN (remote address, method and path, never the token
// it tried), at most one line a second (those refused within a second of a
// line are counted, and logged as one line with their count and the latest
// of them at the end of that second);
// state-changing requests are POSTs guarded by [http.CrossOriginProtection];
// a request a browser makes for a page of another origin (an image, a
// fetch, a frame: its Sec-Fetch-Site) is refused, a read too (on RabbitMQ a
// page of dead letters walks the dead-letter queue, on SQS it receives
// them); a link followed to the dashboard from another site gets a page
// that leads on to the one it names by a same-origin link (another site
// could open such links in a loop, each a walk); ReadOnly hides
// and refuses every change; every answer, the 401 too, forbids framing
// (CSP frame-ancestors 'none' and X-Frame-Options: DENY), inline scripts and
// caching, and one served over TLS (the request's TLS is set: the caller's
// http.Server serves HTTPS) tells the browser to come back only over HTTPS
// (Strict-Transport-Security, a year; never over plain HTTP, where it would
// be both ignored and a lie); the banner a page shows after a change or a
// pause is the server's record of what it did, under a single-use token in the redirect
// (a crafted link cannot make it claim a count); message text is escaped
// by html/template, and
// control characters, bidirectional-text controls and invisible characters
// (zero-width, tag characters, …) are shown as escapes, and a backslash
// as \\ (a JSON body is shown as JSON) so that no text reads as an escape
// it is not (in JSON, those
// encoding/json leaves raw, as \u escapes). Where to listen, TLS, refusing a
// non-loopback address without a token, and, without a token, refusing a
// request whose Host is not a loopback name (DNS rebinding), are the
// caller's part (`berth ui` does them: -tls-cert and -tls-key). The token
// is compared as a SHA-256 digest, so that the time of a refusal does not
// tell its length.
//
// Bodies: a dead letter's page shows the first MiB of its body; the API's
// listing (GET /api/queues/{queue}/dead-letters) the first 4 KiB of each
// (cut between characters; body_cut says it was cut, body_size is the whole
// body's length in bytes), and of every other field but the ID (headers,
// type, keys, correlation ID, the dead-letter history) the first KiB
// (fields_cut), and a dead letter's own document (GET
// /api/queues/{queue}/dead-letters/{id}, the listing's url) all of it.
//
// A broker that does not answer: each read (a page, a GET of the API, a
// confirmation's count) and each pause has Options.Timeout, past which it
// fails with 503 and says so; the overview's live refresh sends no request
// while the last one is still waiting.
package dashboard

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

//go:embed assets templates
var files embed.FS

// Options configure a [Dashboard]. The zero value is a read-write dashboard
// without authentication, for a loopback address.
type Options struct {
	// ReadOnly hides every change and refuses it (403).
	ReadOnly bool
	// Token, when set, is required by every request: "Authorization: Bearer
	// TOKEN", or HTTP basic auth with TOKEN as the password (any user name).
	// It has at least MinTokenLength bytes ([New] refuses a shorter one with
	// an error wrapping [ErrShortToken]): a random one, e.g. the output of
	// `openssl rand -hex 16`. A request refused for a wrong token is logged
	// at WARN through Logger, at most one line a second.
	Token string
	// Queues are shown on the overview besides those the broker lists; on a
	// broker that cannot list its queues (RabbitMQ, SQS) they are the
	// overview.
	Queues []string
	// Title names the broker in the page header, e.g. its URL without the
	// password. It is shown as text.
	Title string
	// Jobs, when set, adds the job-state pages (/jobs) read from it.
	Jobs ledger.Reader
	// Pauses, when set, shows paused queues and lets operators pause and
	// resume them (package pause's table, which Workers apply).
	Pauses Pauses
	// PageSize is the number of dead letters per page. Default 50.
	PageSize int
	// Timeout bounds the broker and database calls of one request that
	// reads (a page, a GET of the API, a confirmation's count) or pauses a
	// queue: past it the request fails with 503 and says the broker did
	// not answer in time, instead of hanging on a broker that is down.
	// Default DefaultTimeout. A redrive or purge is not cut by it: each of
	// its broker calls has its own bound (2 minutes), and it stops between
	// pages when its client goes away, reporting what it did.
	Timeout time.Duration
	// Logger receives errors of requests. Default slog.Default().
	Logger *slog.Logger
}

// Dashboard is the dashboard's handler. Its methods may be called
// concurrently. It does not own the broker: the caller closes it.
type Dashboard struct {
	b       sdk.Broker
	o       Options
	pages   map[string]*template.Template
	handler http.Handler
	results *results // the banners of changes, until their page shows them
}

// ErrNoDeadLetters is returned by [New] for a broker without the
// sdk.DeadLetters operations.
var ErrNoDeadLetters = errors.New("dashboard: the broker has no dead-letter operations")

// MinTokenLength is the shortest Options.Token, in bytes, that [New]
// accepts. A short token is guessed by anyone who can reach the dashboard
// and try: 16 random bytes (32 hex characters give 128 bits) are not.
const MinTokenLength = 16

// ErrShortToken is wrapped by the error [New] returns for an Options.Token
// shorter than [MinTokenLength] bytes (the token itself is not in it).
var ErrShortToken = errors.New("dashboard: the token is too short")

// New returns the dashboard of b.
func New(b sdk.Broker, o Options) (*Dashboard, error) {
	if _, ok := b.(sdk.DeadLetters); !ok {
		return nil, ErrNoDeadLetters
	}
	if o.Token != "" && len(o.Token) < MinTokenLength {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d (a random one, e.g. openssl rand -hex 16)", ErrShortToken, len(o.Token), MinTokenLength)
	}
	if o.PageSize <= 0 {
		o.PageSize = 50
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	d := &Dashboard{b: b, o: o, pages: map[string]*template.Template{}, results: newResults()}
	for _, name := range []string{"overview", "queue", "message", "confirm", "jobs", "job", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		d.pages[name] = t
	}
	assets, _ := fs.Sub(files, "assets")
	mux := http.NewServeMux()
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	// The reads and the pauses have Options.Timeout (d.bounded); a
	// change's broker calls have dlq's own bound.
	timed := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, d.bounded(h)) }
	timed("GET /{$}", d.overview)
	timed("GET /queues/{queue}", d.queue)
	timed("GET /queues/{queue}/confirm", d.confirm)
	mux.HandleFunc("POST /queues/{queue}/{action}", d.change)
	timed("POST /queues/{queue}/pause", d.setPause(true, false))
	timed("POST /queues/{queue}/resume", d.setPause(false, false))
	timed("POST /api/queues/{queue}/pause", d.setPause(true, true))
	timed("POST /api/queues/{queue}/resume", d.setPause(false, true))
	timed("GET /queues/{queue}/messages/{id}", d.message)
	timed(messageByQuery, d.message) // an ID that cannot be a path segment (notSegment)
	timed("GET /jobs", d.jobs)
	timed("GET /jobs/{id}", d.job)
	timed("GET /api/queues", d.apiQueues)
	timed("GET /api/queues/{queue}/dead-letters", d.apiDeadLetters)
	timed("GET /api/queues/{queue}/dead-letters/{id}", d.apiDeadLetter)
	timed(apiDeadLetterByQuery, d.apiDeadLetter)
	mux.HandleFunc("POST /api/queues/{queue}/{action}", d.apiChange)
	timed("GET /api/jobs", d.apiJobs)
	timed("GET /api/jobs/{id}", d.apiJob)
	timed(apiJobByQuery, d.apiJob)
	var h http.Handler = mux
	h = http.NewCrossOriginProtection().Handler(h)
	h = sameOriginOnly(h)
	if o.Token != "" {
		h = requireToken(o.Token, newAuthLog(o.Logger), h)
	}
	h = securityHeaders(h) // outermost: the 401 that asks for the token has them too
	d.handler = h
	return d, nil
}

// The routes that take a dead letter's or job's ID in the query ("id"), for
// an ID that cannot be a path segment (".", ".." and "/": see notSegment; and
// for a dead letter the empty ID): the dead letter's page, and the API's dead
// letter and job.
const (
	messageByQuery       = "GET /queues/{queue}/message"
	apiDeadLetterByQuery = "GET /api/queues/{queue}/dead-letter"
	apiJobByQuery        = "GET /api/job"
)

// idOf returns the ID a request names: the {id} of its path, or on a route
// ByQuery its "id" parameter (an error when that is missing).
func idOf(r *http.Request) (string, error) {
	switch r.Pattern {
	case messageByQuery, apiDeadLetterByQuery:
		// A dead letter's ID may be empty (a RabbitMQ message published
		// without a message-id): "id=" names it.
		if q := r.URL.Query(); q.Has("id") {
			return q.Get("id"), nil
		}
		return "", &badRequest{"id: name the dead letter or job"}
	case apiJobByQuery:
		if id := r.URL.Query().Get("id"); id != "" {
			return id, nil
		}
		return "", &badRequest{"id: name the dead letter or job"}
	}
	return r.PathValue("id"), nil
}

// DefaultTimeout is Options.Timeout when none is set.
const DefaultTimeout = time.Minute

// bounded runs h with Options.Timeout on its request's context.
func (d *Dashboard) bounded(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d.o.Timeout)
		defer cancel()
		h(w, r.WithContext(ctx))
	})
}

// ServeHTTP serves the dashboard.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.handler.ServeHTTP(w, r) }

// constantTimeCompare is subtle.ConstantTimeCompare; a test replaces it to
// see what requireToken compares.
var constantTimeCompare = subtle.ConstantTimeCompare

// requireToken answers 401 to a request that does not carry token, as a
// bearer token or the password of basic auth. It compares SHA-256 digests,
// not the tokens: subtle.ConstantTimeCompare returns at once for inputs of
// different lengths, so comparing the tokens as they are would let the time
// of a refusal tell the token's length. Digests have one length, and
// hashing what a client sent takes time by its length, which it knows.
// A refusal of a request that carried a token (a wrong one) goes to log;
// one that carried none (a browser's first request, before it asks for the
// password) is not a failed login and is not logged.
func requireToken(token string, log *authLog, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var got string
		if _, pw, ok := r.BasicAuth(); ok {
			got = pw
		} else if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			got = t
		}
		sum := sha256.Sum256([]byte(got))
		if constantTimeCompare(sum[:], want[:]) != 1 {
			if r.Header.Get("Authorization") != "" {
				log.refused(r)
			}
			// The body of a refused request is not waited for: the server
			// reads what a handler left of it before it answers (to keep
			// the connection), and a client that announced a body and
			// never sent it held the connection, with no answer, for as
			// long as it liked (berth ui has no ReadTimeout, which would
			// cut a long redrive): anyone who can reach the address,
			// without the token, could hold connections until the process
			// ran out of files. Such a connection is closed after the 401
			// instead. (Only one with a body: the deadline also ends the
			// connection's context, which a request without a body, a
			// browser's first, would pass on to the next request on it.)
			if r.ContentLength != 0 {
				w.Header().Set("Connection", "close")
				_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="berth", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameOriginOnly refuses (403) a request a browser made for a page of another
// origin (Fetch Metadata: Sec-Fetch-Site other than same-origin or none),
// and answers a top-level navigation with GET or HEAD (a link to the
// dashboard from a chat or a runbook) with a page whose same-origin link
// leads on to the page it named (continueTmpl), read only then: another
// site could open such links in a loop (window.open, location). Reads have
// effects too: on RabbitMQ a
// page of dead letters, a dead letter or a confirmation walks the whole
// dead-letter queue, taking every letter and republishing it, and on SQS it
// holds the letters invisible and counts a receive of each; walks that
// overlap make each other, and a redrive under way, stop short. Before, any
// web page the operator opened could make the dashboard do that, as often
// as it liked, with an <img> or a no-cors fetch: [http.CrossOriginProtection]
// guards only the unsafe methods. A request without Sec-Fetch-Site (not
// from a browser, or from one too old to send it) is let through; the POSTs
// are still guarded by its Origin.
func sameOriginOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Sec-Fetch-Site") {
		case "", "same-origin", "none":
		default:
			if (r.Method != http.MethodGet && r.Method != http.MethodHead) ||
				r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Header.Get("Sec-Fetch-Dest") != "document" {
				http.Error(w, "cross-site request refused: open the dashboard's page itself", http.StatusForbidden)
				return
			}
			// A link followed from another site: a page that reads the
			// broker only once the operator continues from here, a
			// same-origin link (another site could open such links in a
			// loop with window.open or location, each a walk).
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			if r.Method == http.MethodGet {
				_ = continueTmpl.Execute(w, localURI(r.URL.RequestURI()))
			}
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localURI is uri when it is a path of this origin, else "/": a path that
// begins "//" or "/\\" is another host's to a browser.
func localURI(uri string) string {
	if !strings.HasPrefix(uri, "/") || strings.HasPrefix(uri, "//") || strings.HasPrefix(uri, "/\\") {
		return "/"
	}
	return uri
}

// continueTmpl is the page a link from another site gets (sameOriginOnly):
// the dashboard's page it named, behind one same-origin link.
var continueTmpl = template.Must(template.New("continue").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>berth dashboard</title></head>
<body><p>A link from another site leads to this dashboard page. Pages of dead letters read the broker
(on RabbitMQ a walk of the dead-letter queue), so it is opened only from here:</p>
<p><a id="continue" href="{{.}}">continue to {{.}}</a></p></body></html>
`))

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Frame-Options", "DENY") // for browsers that ignore frame-ancestors
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if r.TLS != nil {
			// Only over TLS: a browser ignores it over plain HTTP (RFC
			// 6797), and there it would claim HTTPS the server lacks.
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

// deadLetters returns the broker's dead-letter operations.
func (d *Dashboard) deadLetters() sdk.DeadLetters { return d.b.(sdk.DeadLetters) }
