package brokerurl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Params are the query parameters of a URL being opened. An [Opener] reads
// each parameter it knows with one call, then calls Done, which reports the
// first bad value or a parameter nobody asked for. Reading a parameter twice
// is allowed. A Params is used by one goroutine.
type Params struct {
	scheme   string
	query    url.Values
	defaults url.Values
	used     map[string]bool
	err      error

	connectTimeout time.Duration // Options.ConnectTimeout
}

// connectWithin returns ctx bounded by the connect timeout
// ([Options.ConnectTimeout], default [DefaultConnectTimeout]) when ctx has
// no deadline and the timeout is not negative, else ctx itself, and finish,
// which the opener calls once connecting is over, with its error: finish
// releases the bound and returns err as it is, or, when the bound ended it
// (not ctx), an error that says so and wraps both err and
// [context.DeadlineExceeded].
func (p *Params) connectWithin(ctx context.Context) (context.Context, func(error) error) {
	if _, ok := ctx.Deadline(); ok || p.connectTimeout < 0 {
		return ctx, func(err error) error { return err }
	}
	d := cmp.Or(p.connectTimeout, DefaultConnectTimeout)
	cctx, cancel := context.WithTimeout(ctx, d)
	return cctx, func(err error) error {
		bounded := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil || !bounded {
			return err
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		return fmt.Errorf("brokerurl: %s: cannot connect: no answer within the connect timeout (%s; Options.ConnectTimeout, as ctx has no deadline): %w", p.scheme, d, err)
	}
}

func (p *Params) get(name string) (string, bool) {
	p.used[name] = true
	if vs, ok := p.query[name]; ok {
		if len(vs) > 1 {
			p.fail(name, "given more than once")
		}
		return vs[0], true
	}
	if vs, ok := p.defaults[name]; ok && len(vs) > 0 {
		if len(vs) > 1 {
			// Refused as in the URL: which of the values was meant is
			// not known, and using the first silently hides the others.
			p.fail(name, "given more than once in Options.Defaults")
		}
		return vs[0], true
	}
	return "", false
}

func (p *Params) fail(name, reason string) {
	if p.err == nil {
		p.err = &ParamError{Scheme: p.scheme, Param: name, Reason: reason}
	}
}

// check fails the parameter name with reason when ok is false: a value that
// parses but that the broker cannot use is a [*ParamError] too, found before
// anything connects.
func (p *Params) check(name string, ok bool, reason string) {
	if !ok {
		p.fail(name, reason)
	}
}

// plainName reports whether s has only letters, digits, '-' and '_' (the
// names the brokers accept for a prefix or suffix).
func plainName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// String returns the parameter name, or def when the URL does not set it.
func (p *Params) String(name, def string) string {
	if v, ok := p.get(name); ok {
		return v
	}
	return def
}

// name returns the parameter name, or def when the URL does not set it; an
// empty value is refused: the built-in openers read their names (a schema, a
// prefix, a region, a file) with it, and there "" would silently select the
// default ("?schema=$SCHEMA" with SCHEMA unset opened the schema "berth").
func (p *Params) name(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if v == "" {
		p.fail(name, "empty value: leave the parameter out for its default")
		return def
	}
	return v
}

// signedInt returns the parameter name as an integer of any sign, or def
// when unset: for options where a negative value means "off" (the memory
// broker's max_deliveries and max_message_size).
func (p *Params) signedInt(name string, def int) int {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		p.fail(name, "want an integer (negative: no limit)")
		return def
	}
	return n
}

// Int returns the parameter name as an integer >= 0, or def when unset.
func (p *Params) Int(name string, def int) int {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		p.fail(name, "want an integer >= 0")
		return def
	}
	return n
}

// Duration returns the parameter name as a duration >= 0 ("30s", "1m30s"),
// or def when unset.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		p.fail(name, "want a duration >= 0 such as 30s")
		return def
	}
	return d
}

// Bool returns the parameter name as a boolean (true/false/1/0), or def
// when unset.
func (p *Params) Bool(name string, def bool) bool {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, "want true or false")
		return def
	}
	return b
}

// Enum returns the parameter name, which must be one of allowed, or def
// when unset.
func (p *Params) Enum(name, def string, allowed ...string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if !slices.Contains(allowed, v) {
		p.fail(name, "want one of "+strings.Join(allowed, ", "))
		return def
	}
	return v
}

// Rest returns the URL's parameters no one has read yet (never a default of
// [Options.Defaults]) and marks them read: an
// opener passes them on to the driver (PostgreSQL's sslmode, for one). A
// parameter given more than once is refused (Done reports it), as for the
// parameters read one by one: a driver would silently use one of the values.
func (p *Params) Rest() url.Values {
	rest := url.Values{}
	for _, k := range slices.Sorted(maps.Keys(p.query)) {
		if vs := p.query[k]; !p.used[k] {
			if len(vs) > 1 {
				p.fail(k, "given more than once")
			}
			rest[k] = vs
			p.used[k] = true
		}
	}
	return rest
}

// Done returns the first bad parameter, or else the first (by name)
// parameter no one read, as a [*ParamError].
func (p *Params) Done() error {
	if p.err != nil {
		return p.err
	}
	var unknown []string
	for k := range p.query {
		if !p.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		p.fail(unknown[0], "unknown parameter")
	}
	return p.err
}
