// Package brokerurl opens a berth broker from a URL, so that programs and the
// berth command name their broker in one string (in the spirit of gocloud's
// URL openers):
//
//	amqp://user:pass@host:5672/vhost?prefetch=32&queue_type=quorum   RabbitMQ
//	amqps://user:pass@host/vhost                                      RabbitMQ over TLS
//	postgres://user:pass@host/db?schema=berth&lease=30s               PostgreSQL job table
//	postgresql://...                                                  the same
//	sqs://us-east-1                                                   AWS SQS in that region
//	http://127.0.0.1:4566?region=eu-west-1                            an SQS endpoint (emulator)
//	https://sqs.eu-west-1.amazonaws.com                               an SQS endpoint (its region read from the host)
//	mem://                                                            a new in-memory broker
//	nats://user:pass@host:4222?ack_wait=30s                           NATS JetStream
//
// Each scheme's query parameters are listed on its opener ([Schemes] lists
// the schemes). A parameter berth does not know for that scheme, or a value it
// cannot use, is an error: a [*ParamError] naming the parameter, wrapping
// [ErrInvalidURL]. So is an empty value of a parameter berth reads itself
// ("?schema=", as "?schema=$SCHEMA" reads with SCHEMA unset): leave a
// parameter out for its default (the ones postgres:// hands on to pgx keep
// pgx's meaning). A URL without "//" after its scheme
// ("amqp:user:pass@host" or "amqp:/user:pass@host", which name no host)
// wraps [ErrInvalidURL] too, unless nothing but a query follows the scheme
// ("mem:?lease=1s").
// A part of the URL that the scheme does not use wraps [ErrInvalidURL] too,
// and the error says which, rather than being ignored silently: a path on
// sqs:// (the queue is not named there), nats:// or mem://, a host on mem://,
// user info on mem://, sqs:// or an SQS endpoint, and a fragment (#…) on
// any built-in scheme. A lone "/" path names nothing and is allowed
// ("sqs://eu-west-1/"). A nats:// host that lists servers
// ("nats://a:4222,b:4222") wraps [ErrInvalidURL] too.
// An '@' in the path or in a parameter's name wraps [ErrInvalidURL] too:
// it ends a password whose '/' or '?' was not percent-encoded
// ("nats://user:/secret@host" names the host "user:"); write %40 for an '@'
// meant there. So does an '@' anywhere in the query after a host with a
// port, or an empty one, and no path ("amqp://user:?se=cret@host",
// "amqp://user:12?se=cret@host": the password had a '?').
// An unknown scheme wraps [ErrUnknownScheme]. No error returned by [Open]
// contains the URL's password.
//
// Opening connects (except sqs://, http(s):// and mem://, which send no
// request). With a ctx that has no deadline, connecting to RabbitMQ or
// PostgreSQL is bounded by [Options.ConnectTimeout] (default
// [DefaultConnectTimeout], 30 s; a postgres:// URL's connect_timeout
// bounds it instead): a host that takes the connection and never answers
// fails Open with an error that says so and wraps
// [context.DeadlineExceeded]. nats:// is bounded by nats.go's own timeout.
// Cancelling ctx ends Open at once.
//
// A new scheme is one entry in the table of schemes.go and one [Opener]; a
// program can add its own through [Options.Schemes] without touching the
// package.
package brokerurl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/berthq/berth/sdk"
)

var (
	// ErrUnknownScheme is wrapped by the error of a URL whose scheme has no
	// opener.
	ErrUnknownScheme = errors.New("brokerurl: unknown scheme")
	// ErrInvalidURL is wrapped by the error of a URL that does not parse or
	// has a bad parameter (then the error is also a [*ParamError]).
	ErrInvalidURL = errors.New("brokerurl: invalid broker URL")
)

// ParamError reports a query parameter that is unknown for the URL's scheme
// or whose value is unusable. It names the parameter and never repeats the
// value (which could be a secret). It wraps [ErrInvalidURL].
type ParamError struct {
	Scheme string // the URL's scheme
	Param  string // the parameter's name
	Reason string // what is wrong, e.g. "unknown parameter", "want a duration such as 30s"
}

// Error implements error.
func (e *ParamError) Error() string {
	return fmt.Sprintf("brokerurl: %s URL: parameter %q: %s", e.Scheme, e.Param, e.Reason)
}

// Unwrap returns [ErrInvalidURL].
func (e *ParamError) Unwrap() error { return ErrInvalidURL }

// An Opener opens the broker a parsed URL names. It reads the scheme's
// parameters from p (which records each one it is asked for) and calls
// [Params.Done] before it connects, so that an unknown or bad parameter fails
// fast. u is the caller's URL with its query intact; the opener must not
// return an error that contains u's password ([Open] scrubs it, decoded or
// percent-encoded, as a second line of defence).
type Opener func(ctx context.Context, u *url.URL, p *Params) (sdk.Broker, error)

// Options adjusts [Open]. The zero value opens the built-in schemes.
type Options struct {
	// Schemes adds openers, or replaces built-in ones, by lower-case scheme.
	// A nil opener is an error when its scheme is opened.
	Schemes map[string]Opener
	// Defaults are query parameters used when the URL does not set them,
	// for example the berth command's "no_declare=true" on amqp:// (it never
	// changes topology). A default a scheme does not know is ignored, and
	// so is one for a parameter its opener passes on to a driver rather
	// than reads by name (postgres://'s sslmode, application_name and the
	// other pgx parameters: [Params.Rest] hands on the URL's only, as a
	// default cannot be told from another scheme's); give those in the URL. A
	// default with more than one value is refused, like a parameter given
	// twice in the URL, with a [*ParamError] — when the scheme reads it.
	Defaults url.Values
	// ConnectTimeout bounds connecting to RabbitMQ (amqp://, amqps://:
	// the TCP connection, TLS and AMQP handshakes, and the retries of a
	// refused connection) and to PostgreSQL (postgres://: the first
	// connection, unless the URL sets pgx's connect_timeout) when ctx has
	// no deadline: a host that takes the connection and never answers
	// would hold Open for ever. Zero is [DefaultConnectTimeout]; negative
	// is none (Open then waits until ctx ends). A ctx with a deadline is
	// bounded by it alone; cancelling ctx ends Open at once either way.
	ConnectTimeout time.Duration
}

// Schemes returns the built-in schemes, sorted.
func Schemes() []string { return slices.Sorted(maps.Keys(schemes)) }

// Open connects to the broker rawURL names. The caller closes the broker.
// Errors never contain the URL's password.
func Open(ctx context.Context, rawURL string, opts Options) (sdk.Broker, error) {
	u, err := url.Parse(rawURL)
	// An opaque URL (no "//" after the scheme: "amqp:user:pass@host") has
	// no host and no userinfo: an opener would connect to its default host
	// instead, and its error could quote the password, which Open cannot
	// find to scrub.
	if err != nil || u.Scheme == "" || u.Opaque != "" || noAuthority(rawURL, u) {
		// url.Parse's error quotes the whole URL, password included.
		return nil, fmt.Errorf("%w: want scheme://[user[:password]@]host[/path][?param=value]", ErrInvalidURL)
	}
	if atAfterHost(rawURL) || queryCutPassword(u) {
		// A '/' or '?' in a password ends the authority early: the rest of
		// the password becomes the path or a parameter's name, which errors
		// quote, and Open, finding no password, scrubs nothing.
		return nil, fmt.Errorf("%w: an '@' follows the host: percent-encode a '/', '?' or '#' in the user or password (%%2F, %%3F, %%23), "+
			"and an '@' in the path or in a parameter's name (%%40)", ErrInvalidURL)
	}
	scheme := strings.ToLower(u.Scheme)
	open, ok := opts.Schemes[scheme]
	if !ok {
		open, ok = schemes[scheme]
	}
	if ok && open == nil {
		return nil, fmt.Errorf("brokerurl: Options.Schemes has a nil opener for scheme %q", scheme)
	}
	if !ok {
		known := Schemes()
		for s := range opts.Schemes {
			known = append(known, s)
		}
		slices.Sort(known)
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownScheme, scheme, strings.Join(slices.Compact(known), ", "))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		// A pair that does not parse (a ';', a bad %-escape) would be dropped
		// silently by u.Query(); the error text quotes it, so it is not kept.
		return nil, fmt.Errorf("%w: the query string does not parse (a ';' or a bad %%-escape)", ErrInvalidURL)
	}
	p := &Params{scheme: scheme, query: q, defaults: opts.Defaults, used: map[string]bool{}, connectTimeout: opts.ConnectTimeout}
	b, err := open(ctx, u, p)
	if err == nil && b == nil { // a custom opener's bug: no broker to use or close
		err = fmt.Errorf("brokerurl: the opener of scheme %q returned neither a broker nor an error", scheme)
	}
	if err == nil {
		if err = p.Done(); err != nil { // an opener that forgot Done
			_ = b.Close()
			b = nil
		}
	}
	if err != nil {
		return nil, scrub(err, passwordForms(rawURL, u))
	}
	return b, nil
}

// noAuthority reports whether rawURL has something other than a query
// after its scheme without the "//" that starts a host: "amqp:/user:pass@host"
// parses with no host and no userinfo, the whole rest as a path, as an
// opaque URL does. "mem:" and "mem:?lease=1s" name nothing and pass.
func noAuthority(rawURL string, u *url.URL) bool {
	rest := rawURL[len(u.Scheme)+1:] // url.Parse took the scheme as written
	if strings.HasPrefix(rest, "//") {
		return false
	}
	rest, _, _ = strings.Cut(rest, "#")
	rest, _, _ = strings.Cut(rest, "?")
	return rest != ""
}

// atAfterHost reports whether rawURL has an '@' in its path or in a
// parameter's name, as written: there it is the end of user info cut short
// by a '/' or '?' of the password ("nats://user:/secret@host" has the host
// "user:" and the path "/secret@host").
func atAfterHost(rawURL string) bool {
	rest, _, _ := strings.Cut(rawURL, "#")
	_, rest, ok := strings.Cut(rest, "//")
	if !ok {
		return false
	}
	rest, query, _ := strings.Cut(rest, "?")
	if i := strings.Index(rest, "/"); i >= 0 && strings.Contains(rest[i:], "@") {
		return true
	}
	for pair := range strings.SplitSeq(query, "&") {
		if name, _, _ := strings.Cut(pair, "="); strings.Contains(name, "@") {
			return true
		}
	}
	return false
}

// queryCutPassword reports whether u is a URL whose password began with a
// '?' written as is: "amqp://admin:?ab=cd@host" has no user info, the host
// "admin:" (an empty port) and the query "ab=cd@host", whose '@' is in a
// value, where atAfterHost does not look (an '@' is a valid value there);
// the parameter "ab", a piece of the password, would be quoted as unknown,
// or sent to the server as a setting. A password whose '?' follows digits
// ("admin:12?ab=cd@host") gives the host a port ("admin:12"): so a host
// with a port, or an empty one, no user info, no path and an '@' in the
// query is refused too (write %40 for an '@' meant in a value there).
func queryCutPassword(u *url.URL) bool {
	return u.User == nil && strings.Contains(u.Host, ":") && u.Path == "" && strings.Contains(u.RawQuery, "@")
}

// passwordForms returns the forms in which u's password can show in an
// error: decoded, as written in rawURL, and escaped as url.URL.String,
// url.QueryEscape and url.PathEscape write it (a password with an '@', a '/'
// or a '%' is percent-encoded in the URL). Longest first, without repeats.
func passwordForms(rawURL string, u *url.URL) []string {
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return nil
	}
	forms := []string{pw, url.QueryEscape(pw), url.PathEscape(pw)}
	if _, enc, ok := strings.Cut(url.UserPassword("", pw).String(), ":"); ok {
		forms = append(forms, enc)
	}
	// As written: the userinfo of the authority, cut as url.Parse cuts it.
	rest, _, _ := strings.Cut(rawURL, "#")
	rest, _, _ = strings.Cut(rest, "?")
	if _, rest, ok = strings.Cut(rest, "://"); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if i := strings.LastIndex(authority, "@"); i >= 0 {
			if _, written, ok := strings.Cut(authority[:i], ":"); ok && written != "" {
				forms = append(forms, written)
			}
		}
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(forms)
}

// scrub returns err, or an error of the same identity whose text has each of
// secrets replaced, if the text contains one of them.
func scrub(err error, secrets []string) error {
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			return &scrubbed{err: err, secrets: secrets}
		}
	}
	return err
}

type scrubbed struct {
	err     error
	secrets []string // longest first
}

func (s *scrubbed) Error() string {
	msg := s.err.Error()
	for _, secret := range s.secrets {
		msg = strings.ReplaceAll(msg, secret, "xxxxx")
	}
	return msg
}
func (s *scrubbed) Unwrap() error { return s.err }

// DefaultConnectTimeout is the default of [Options.ConnectTimeout].
const DefaultConnectTimeout = 30 * time.Second
