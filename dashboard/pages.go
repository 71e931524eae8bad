package dashboard

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

var funcs = template.FuncMap{
	// text shows untrusted text with control characters as escapes;
	// html/template escapes the HTML.
	"text":  func(s string) string { return dlq.EscapeText(s, false) },
	"multi": func(s string) string { return dlq.EscapeText(s, true) },
	"age": func(d time.Duration) string {
		if d <= 0 {
			return "–"
		}
		return d.Round(time.Second).String()
	},
	// short is text cut to n runes, between whole escapes.
	"short": dlq.EscapeTextShort,
	// ago shows an RFC 3339 time as its age ("5m ago"), or the text as
	// is, cut to 40 runes as the other cells of a row (the header may be
	// forged, and of any length): so too a time in the future, which has
	// no age (a forged header, or a worker's clock ahead of this one).
	"ago": func(ts string) string {
		t, err := time.Parse(time.RFC3339Nano, ts)
		d := time.Since(t)
		if err != nil || d < 0 {
			return dlq.EscapeTextShort(ts, 40)
		}
		switch {
		case d < time.Minute:
			return fmt.Sprintf("%ds ago", int(d.Seconds()))
		case d < time.Hour:
			return fmt.Sprintf("%dm ago", int(d.Minutes()))
		case d < 48*time.Hour:
			return fmt.Sprintf("%dh ago", int(d.Hours()))
		}
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	},
	// at shows a job's time with layout, or "infinity" and "-infinity"
	// for what a ledger reader gives for those (ledger.Infinity, also a
	// time after 9999, and ledger.NegativeInfinity).
	"at":    showTime,
	"plus":  func(a, b int) int { return a + b },
	"minus": func(a, b int) int { return a - b },
	"list":  func(s ...string) []string { return s },
	// header is a header of m, raw: show it through text, short or ago.
	"header": func(m *sdk.Message, name string) string {
		return m.Header(name)
	},
	// path is s as one segment of a URL path: html/template leaves "?",
	// "#" and "/" of a link as they are, so an ID must be escaped here
	// (the handlers' PathValue decodes it).
	"path": url.PathEscape,
	// messageURL and jobURL link to a dead letter's and a job's page.
	"messageURL": messageURL,
	// apiDeadLetterURL is the API's URL of a dead letter, whole body included.
	"apiDeadLetterURL": apiDeadLetterURL,
	"jobURL":           jobURL,
	// idName and idValue put a dead letter's ID in a form field: as it
	// is ("id"), or in base64 ("id64") when a browser would not send it
	// back as it is (see plainID).
	"idName": func(id string) string {
		if plainID(id) {
			return "id"
		}
		return "id64"
	},
	"idValue": func(id string) string {
		if plainID(id) {
			return id
		}
		return base64.StdEncoding.EncodeToString([]byte(id))
	},
	// query is a url.Values as a link's query string: {{.}} of a string
	// after the "?" of a link is escaped as one value, "=" and "&" too.
	"query": query,
	// jsonString is s as a JSON string, as the API writes it: a row's key
	// for the overview's live refresh (see app.js). An attribute holding
	// the name as it is would not do: an HTML parser reads a carriage
	// return in it as a line feed, html/template writes a NUL as U+FFFD,
	// and encoding/json writes each byte that is not UTF-8 as U+FFFD.
	"jsonString": func(s string) (string, error) {
		b, err := json.Marshal(s)
		return string(b), err
	},
}

// notSegment reports whether id cannot be a segment of a URL path: "." or
// ".." (the current or the parent directory), which browsers and
// http.ServeMux resolve (escaped as %2E too) before routing, and "/", whose
// escaped segment %2F http.ServeMux takes for a trailing slash, which no
// {id} matches. A link to it would show another page, or none.
func notSegment(id string) bool { return id == "." || id == ".." || id == "/" }

// messageURL is the path of the page of queue's dead letter id: the ID as a
// path segment, or in the query (see notSegment).
func messageURL(queue, id string) string {
	if notSegment(id) || id == "" { // "": a path ending in "/", which no {id} matches
		return "/queues/" + url.PathEscape(queue) + "/message?id=" + url.QueryEscape(id)
	}
	return "/queues/" + url.PathEscape(queue) + "/messages/" + url.PathEscape(id)
}

// apiDeadLetterURL is the API path of queue's dead letter id (the whole
// message, body included): the ID as a path segment, or in the query (see
// notSegment).
func apiDeadLetterURL(queue, id string) string {
	if notSegment(id) || id == "" {
		return "/api/queues/" + url.PathEscape(queue) + "/dead-letter?id=" + url.QueryEscape(id)
	}
	return "/api/queues/" + url.PathEscape(queue) + "/dead-letters/" + url.PathEscape(id)
}

// jobURL is the path of the page of job id: /jobs/ID, or the lookup by ID
// in the query, which shows the job (see notSegment).
func jobURL(id string) string {
	if notSegment(id) {
		return "/jobs?id=" + url.QueryEscape(id)
	}
	return "/jobs/" + url.PathEscape(id)
}

// plainID reports whether a browser sends id back from a form field as it
// is. One that is not UTF-8 (a raw AMQP message-id is bytes) comes back
// with U+FFFD for its bad bytes, a NUL as U+FFFD and line breaks as CRLF:
// the change would name another dead letter, or none, and report it gone.
func plainID(id string) bool {
	return utf8.ValidString(id) && !strings.ContainsFunc(id, unicode.IsControl)
}

// formIDs returns the IDs a form names: its "id" fields, and its "id64"
// fields decoded (see plainID).
func formIDs(form url.Values) ([]string, error) {
	ids := slices.Clone(form["id"])
	for _, v := range form["id64"] {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, &badRequest{"id64: want an ID in base64"}
		}
		ids = append(ids, string(b))
	}
	return ids, nil
}

// page is what every template gets.
type page struct {
	Title    string
	ReadOnly bool
	HasJobs  bool
	Data     any
}

func (d *Dashboard) render(w http.ResponseWriter, name string, status int, data any) {
	var buf bytes.Buffer
	p := page{Title: d.o.Title, ReadOnly: d.o.ReadOnly, HasJobs: d.o.Jobs != nil, Data: data}
	if err := d.pages[name].Execute(&buf, p); err != nil {
		d.o.Logger.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// logFailure logs a request that failed with a server error (500, or 503:
// the broker unavailable or not answering within Options.Timeout) at
// ERROR, but one whose client went away first (its context cancelled) at
// DEBUG: that failure is the client's, not the dashboard's or its broker's.
//
// A broker scan that stopped before the end of the dead-letter queue (503,
// see [scanStopped]) is logged at WARN: the broker answered, and the
// operator is told to try again.
func (d *Dashboard) logFailure(r *http.Request, status int, err error) {
	switch {
	case status != http.StatusInternalServerError && status != http.StatusServiceUnavailable:
	case errors.Is(r.Context().Err(), context.Canceled):
		d.o.Logger.Debug("dashboard: request ended by its client", "method", r.Method, "path", r.URL.Path, "err", err)
	case errors.As(err, new(*scanStopped)):
		d.o.Logger.Warn("dashboard: dead-letter scan stopped before the end", "method", r.Method, "path", r.URL.Path, "err", err)
	default:
		d.o.Logger.Error("dashboard: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

// fail shows err as a page with the status it means.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, err error) {
	err = d.timedOut(r, err)
	status := statusOf(err)
	d.logFailure(r, status, err)
	d.render(w, "error", status, map[string]any{"Status": status, "Error": err.Error()})
}

func statusOf(err error) int {
	var be *badRequest
	switch {
	case errors.As(err, &be):
		return http.StatusBadRequest
	case errors.Is(err, errReadOnly):
		return http.StatusForbidden
	case errors.Is(err, sdk.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, sdk.ErrInvalidQueue):
		return http.StatusBadRequest
	case errors.As(err, new(*brokerTimeout)), errors.Is(err, context.DeadlineExceeded), errors.Is(err, sdk.ErrUnavailable),
		errors.As(err, new(*scanStopped)):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// getDeadLetter is GetDeadLetter of the dashboard's broker. A broker scan
// that stopped before the end of the dead-letter queue without finding id
// (SQS: letters held invisible by another reader, or queued in a FIFO
// group behind those the scan held) neither found it nor showed it is
// missing: it is returned as a [*scanStopped] (503, try again), not as a
// failure of the dashboard.
func (d *Dashboard) getDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	m, err := d.deadLetters().GetDeadLetter(ctx, queue, id)
	if err != nil && dlq.ScanIncomplete(err) {
		return nil, &scanStopped{id: id, err: err}
	}
	return m, err
}

// scanStopped is the error of a look-up of dead letter id whose broker
// scan stopped before the end of the dead-letter queue: a partial answer,
// 503, logged at WARN. Its text is shown escaped, as every error is.
type scanStopped struct {
	id  string
	err error
}

func (e *scanStopped) Error() string {
	return fmt.Sprintf("dead letter %s was not found, but the broker's scan stopped before the end of the dead-letter queue "+
		"(it may be among the letters it could not see); try again: %v", e.id, e.err)
}

func (e *scanStopped) Unwrap() error { return e.err }

// timedOut returns err as a *brokerTimeout when the request ran out of
// Options.Timeout (its context's deadline passed), whatever err a broker
// made of that; else err.
func (d *Dashboard) timedOut(r *http.Request, err error) error {
	if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		return &brokerTimeout{after: d.o.Timeout, err: err}
	}
	return err
}

// brokerTimeout is the error of a request whose broker or database did not
// answer within Options.Timeout: 503.
type brokerTimeout struct {
	after time.Duration
	err   error
}

func (e *brokerTimeout) Error() string {
	return fmt.Sprintf("the broker did not answer within %v: it may be down or overloaded, or the scan too long "+
		"(narrow the filter, or raise the bound: berth ui -request-timeout): %v", e.after, e.err)
}

func (e *brokerTimeout) Unwrap() error { return e.err }

type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

var errReadOnly = errors.New("the dashboard is read-only")

// queueRow is one line of the overview.
type queueRow struct {
	Queue        string  `json:"queue"`
	Ready        int64   `json:"ready"`
	Delayed      int64   `json:"delayed"`
	InFlight     int64   `json:"in_flight"`
	DeadLettered int64   `json:"dead_lettered"`
	OldestAgeSec float64 `json:"oldest_age_seconds"`
	OldestAge    string  `json:"oldest_age"`
	// PausedSince is when the queue was paused (Options.Pauses), else nil.
	PausedSince *time.Time `json:"paused_since,omitempty"`
}

func (d *Dashboard) queueRows(ctx context.Context) ([]queueRow, error) {
	names := slices.Clone(d.o.Queues)
	// Queues only the broker listed may be deleted before their Stats are
	// read; those configured or paused are reported even when missing.
	onlyListed := map[string]bool{}
	if ql, ok := d.b.(dlq.QueueLister); ok {
		more, err := ql.Queues(ctx)
		if err != nil {
			return nil, err
		}
		for _, q := range more {
			onlyListed[q] = true
		}
		names = append(names, more...)
	}
	for _, q := range d.o.Queues {
		delete(onlyListed, q)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	paused, err := d.pausedSince(ctx)
	if err != nil {
		return nil, fmt.Errorf("paused queues: %w", err)
	}
	for q := range paused { // a paused queue is shown even if the broker does not list it
		delete(onlyListed, q)
		if !slices.Contains(names, q) {
			names = append(names, q)
		}
	}
	slices.Sort(names)
	rows := make([]queueRow, 0, len(names))
	in, _ := d.b.(sdk.Inspector)
	for _, q := range names {
		row := queueRow{Queue: q, OldestAge: "–"}
		if in != nil {
			st, err := in.Stats(ctx, q)
			if errors.Is(err, sdk.ErrNotFound) && onlyListed[q] {
				continue // deleted since the broker listed it
			}
			if err != nil {
				return nil, fmt.Errorf("stats of %s: %w", q, err)
			}
			row = queueRow{Queue: q, Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, DeadLettered: st.DeadLettered,
				OldestAgeSec: st.OldestAge.Seconds(), OldestAge: funcs["age"].(func(time.Duration) string)(st.OldestAge)}
		}
		if since, ok := paused[q]; ok {
			row.PausedSince = &since
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	rows, err := d.queueRows(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	d.render(w, "overview", http.StatusOK, map[string]any{"Queues": rows, "Listed": d.canList(), "Pauses": d.o.Pauses != nil})
}

func (d *Dashboard) canList() bool { _, ok := d.b.(dlq.QueueLister); return ok }

// filterForm is a dead-letter filter as the query string carries it.
type filterForm struct {
	Type, Class, Reason, OlderThan, NewerThan string
}

func (f filterForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "class": f.Class, "reason": f.Reason, "older_than": f.OlderThan, "newer_than": f.NewerThan} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// IsZero reports whether the form sets no criterion: it matches every
// dead letter.
func (f filterForm) IsZero() bool { return f == filterForm{} }

// ReasonRE reports whether the reason criterion is a regexp ("/re/", see
// dlq.Filter.ParseReason) rather than a substring.
func (f filterForm) ReasonRE() bool {
	return len(f.Reason) >= 2 && strings.HasPrefix(f.Reason, "/") && strings.HasSuffix(f.Reason, "/")
}

// Query is the filter as a query string (without "?"), for a link:
// html/template would percent-encode the "=" and "&" of a string there,
// leaving one meaningless parameter (see the "query" func).
func (f filterForm) Query() template.URL { return query(f.values()) }

// query is v encoded as a URL's query, for a template's link. v.Encode
// percent-encodes every key and value, so what it returns is safe in a URL
// and the template only has to HTML-escape it (the "&"s).
func query(v url.Values) template.URL { return template.URL(v.Encode()) }

func parseFilter(q url.Values) (filterForm, dlq.Filter, error) {
	ff := filterForm{Type: q.Get("type"), Class: q.Get("class"), Reason: q.Get("reason"), OlderThan: q.Get("older_than"), NewerThan: q.Get("newer_than")}
	var f dlq.Filter
	for _, t := range strings.Split(ff.Type, ",") {
		if t = strings.TrimSpace(t); t != "" {
			f.Types = append(f.Types, t)
		}
	}
	f.Class = ff.Class
	if err := f.ParseReason(ff.Reason); err != nil {
		return ff, f, &badRequest{err.Error()}
	}
	for _, p := range []struct {
		name, s string
		to      *time.Duration
	}{{"older than", ff.OlderThan, &f.OlderThan}, {"newer than", ff.NewerThan, &f.NewerThan}} {
		if p.s == "" {
			continue
		}
		dur, err := time.ParseDuration(p.s)
		if err != nil || dur < 0 {
			return ff, f, &badRequest{p.name + ": want a duration such as 24h or 30m"}
		}
		*p.to = dur
	}
	return ff, f, nil
}

func intParam(q url.Values, name string, def int) (int, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, &badRequest{name + ": want an integer >= 0"}
	}
	return n, nil
}

// queuePage is the data of a queue's dead-letter page.
type queuePage struct {
	Queue   string
	Filter  filterForm
	Listing dlq.Listing
	First   int // 1-based number of the first row
	Prev    int // offset of the previous page, -1 on the first
	// Flash is the banner of the change or pause that redirected here,
	// from the server's record of it (see results), or "".
	Flash string
	// Pauses: the dashboard has a pause table; PausedSince is set when the
	// queue is paused.
	Pauses      bool
	PausedSince *time.Time
}

func (d *Dashboard) queue(w http.ResponseWriter, r *http.Request) {
	queue := r.PathValue("queue")
	q := r.URL.Query()
	ff, f, err := parseFilter(q)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	offset, err := intParam(q, "offset", 0)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	l, err := dlq.List(r.Context(), d.deadLetters(), queue, f, offset, d.o.PageSize, dlq.Options{})
	if err != nil {
		d.fail(w, r, err)
		return
	}
	prev := -1
	if offset > 0 {
		prev = max(0, offset-d.o.PageSize)
	}
	page := queuePage{Queue: queue, Filter: ff, Listing: l, First: offset + 1, Prev: prev, Flash: d.results.take(queue, q.Get("result")), Pauses: d.o.Pauses != nil}
	paused, err := d.pausedSince(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	if since, ok := paused[queue]; ok {
		page.PausedSince = &since
	}
	d.render(w, "queue", http.StatusOK, page)
}

// selection is what a change applies to: IDs, or every match of a filter,
// bounded by the count the operator confirmed.
type selection struct {
	Action string
	All    bool
	IDs    []string
	Filter filterForm
	Limit  int
}

func parseSelection(r *http.Request, form url.Values) (selection, dlq.Filter, error) {
	s := selection{Action: r.PathValue("action"), All: form.Get("all") == "1"}
	ids, err := formIDs(form)
	if err != nil {
		return s, dlq.Filter{}, err
	}
	s.IDs = ids
	if s.Action == "" {
		s.Action = form.Get("action")
	}
	if s.Action != "redrive" && s.Action != "purge" {
		return s, dlq.Filter{}, &badRequest{"the action is redrive or purge"}
	}
	ff, f, err := parseFilter(form)
	if err != nil {
		return s, f, err
	}
	s.Filter = ff
	if s.All {
		s.IDs = nil
	} else {
		if len(s.IDs) == 0 {
			return s, f, &badRequest{"nothing selected: tick dead letters, or \"all matching\""}
		}
		f.IDs = s.IDs
	}
	if s.Limit, err = intParam(form, "limit", 0); err != nil {
		return s, f, err
	}
	return s, f, nil
}

// confirmPage is the data of the confirmation page.
type confirmPage struct {
	Queue   string
	Sel     selection
	Count   int
	Missing []string
	Sample  []*sdk.Message
	Verb    string
	// Incomplete: the preview's scan stopped before the end of the
	// dead-letter queue (why); Count is a lower bound.
	Incomplete string
	// Shared is how many of the Count letters have the empty ID when the
	// selection names it (see preview), else 0. SharedIDs is how many of
	// them share another chosen ID with other letters (a producer that
	// reused an ID, a message dead-lettered twice): a change of the ID
	// moves them all (dlq.Summary.Shared).
	Shared    int
	SharedIDs int
	// Withheld is how many more letters the filter (without IDs) matches
	// that the change leaves, not in Count: dead letters it does not choose
	// hold their IDs too, and a change of an ID moves every letter holding
	// it (dlq.Summary.Withheld). Limit is the change's dlq.Options.Limit,
	// every letter matched (Count and Withheld): the change walks the same
	// letters and leaves the same ones.
	Withheld int
	Limit    int
	// WithheldIDs are the first maxShownIDs of the IDs of the Withheld
	// letters, in the order met; NWithheldIDs is how many the preview
	// named (dlq.Summary.WithheldIDs), at most dlq.MaxFailures:
	// WithheldIDsCapped says there may be more.
	WithheldIDs       []string
	NWithheldIDs      int
	WithheldIDsCapped bool
	// ShownIDs are the first maxShownIDs of the distinct IDs the selection
	// names, shown with the filter; NIDs is how many it names.
	ShownIDs []string
	NIDs     int
}

// maxShownIDs is the most of a selection's IDs its confirmation lists (a
// page's "select all" ticks hundreds; a crafted link may name thousands).
const maxShownIDs = 20

// distinct returns ids without repeats, in order.
func distinct(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// preview is dlq.Preview of a change for the confirmation page, keeping
// keep letters for its sample, and how many of the chosen letters have the
// empty ID.
//
// A selection naming the empty ID (RabbitMQ messages a producer outside
// berth published without a message-id, which often are many) chooses
// every dead letter that has it and matches the filter: no broker call can
// address one of them alone (brokers move each letter holding an ID they
// are given; RabbitMQ's sweep chooses by ID too). dlq.Preview, which looks
// each chosen ID up on a broker that pages (GetDeadLetter), would count one
// letter for it, and the change, confirmed for one, would move them all.
// So such a selection is counted letter by letter, by a walk of the
// dead-letter queue (the one sweep dlq.Preview makes on RabbitMQ), and the
// page says how many share the empty ID. (dlq.Preview now counts every
// letter holding a chosen ID too, and the change is limited by letters:
// the walk is kept for that count of the empty ID; it counts as
// dlq.Preview does, the first letter holding an ID deciding whether it
// is chosen.)
func (d *Dashboard) preview(ctx context.Context, queue string, f dlq.Filter, keep int) (s dlq.Summary, sample []*sdk.Message, missing []string, shared int, err error) {
	if !slices.Contains(f.IDs, "") {
		s, sample, missing, err = dlq.Preview(ctx, d.deadLetters(), queue, f, dlq.Options{}, keep)
		return s, sample, missing, 0, err
	}
	rest := f
	rest.IDs = nil
	seen := map[string]bool{}
	chosen := map[string]bool{}
	held := map[string]int{}
	matched := 0
	s, err = dlq.Walk(ctx, d.deadLetters(), queue, dlq.Filter{IDs: f.IDs}, dlq.Options{}, func(page []*sdk.Message) error {
		now := time.Now()
		for _, m := range page {
			if !seen[m.ID] {
				// The first letter holding an ID decides whether it is
				// chosen, as in dlq.Preview; a change of a chosen ID moves
				// every letter holding it, so each is counted.
				seen[m.ID] = true
				chosen[m.ID] = rest.Match(m, now)
			}
			if !chosen[m.ID] {
				continue
			}
			matched++
			held[m.ID]++
			if m.ID == "" {
				shared++
			}
			if len(sample) < keep {
				sample = append(sample, m)
			}
		}
		return nil
	})
	if err != nil {
		return s, nil, nil, 0, err
	}
	s.Matched = matched
	for id, n := range held {
		if id != "" && n > 1 {
			s.Shared += n
		}
	}
	if s.Incomplete == "" { // a scan that stopped short cannot tell an ID is gone
		for _, id := range f.IDs {
			if !seen[id] {
				seen[id] = true
				missing = append(missing, id)
			}
		}
	}
	return s, sample, missing, shared, nil
}

func (d *Dashboard) confirm(w http.ResponseWriter, r *http.Request) {
	if d.o.ReadOnly {
		d.fail(w, r, errReadOnly)
		return
	}
	queue := r.PathValue("queue")
	sel, f, err := parseSelection(r, r.URL.Query())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	s, sample, missing, shared, err := d.preview(r.Context(), queue, f, 10)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	sel.Limit = s.Matched
	verb := map[string]string{"redrive": "Redrive", "purge": "Delete for good"}[sel.Action]
	ids := distinct(sel.IDs)
	var withheld []string // the IDs of the letters the change leaves, the first maxShownIDs
	for _, fl := range s.WithheldIDs[:min(len(s.WithheldIDs), maxShownIDs)] {
		withheld = append(withheld, fl.ID)
	}
	d.render(w, "confirm", http.StatusOK, confirmPage{Queue: queue, Sel: sel, Count: s.Matched - s.Withheld, Missing: missing, Sample: sample, Verb: verb,
		Incomplete: s.Incomplete, Shared: shared, SharedIDs: s.Shared, Withheld: s.Withheld, Limit: s.Matched,
		WithheldIDs: withheld, NWithheldIDs: len(s.WithheldIDs), WithheldIDsCapped: len(s.WithheldIDs) == dlq.MaxFailures,
		ShownIDs: ids[:min(len(ids), maxShownIDs)], NIDs: len(ids)})
}

func (d *Dashboard) change(w http.ResponseWriter, r *http.Request) {
	if d.o.ReadOnly {
		d.fail(w, r, errReadOnly)
		return
	}
	if err := r.ParseForm(); err != nil {
		d.fail(w, r, &badRequest{"the form does not parse"})
		return
	}
	queue := r.PathValue("queue")
	sel, f, err := parseSelection(r, r.PostForm)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	if sel.Limit <= 0 {
		d.fail(w, r, &badRequest{"confirm first: the count to change is missing"})
		return
	}
	res, err := d.apply(r.Context(), queue, sel.Action, f, sel.Limit)
	if err != nil {
		if res.Done > 0 || res.Missed > 0 {
			err = &stoppedChange{action: sel.Action, res: res, err: err}
		}
		d.fail(w, r, err)
		return
	}
	v := sel.Filter.values()
	v.Set("result", d.results.put(queue, changeBanner(sel.Action, res)))
	http.Redirect(w, r, "/queues/"+url.PathEscape(queue)+"?"+v.Encode(), http.StatusSeeOther)
}

func (d *Dashboard) apply(ctx context.Context, queue, action string, f dlq.Filter, limit int) (dlq.Result, error) {
	act := dlq.Redrive
	if action == "purge" {
		act = dlq.Delete
	}
	res, err := dlq.Apply(ctx, d.deadLetters(), queue, f, act, dlq.Options{Limit: limit}, nil)
	if err != nil {
		// What was done before the error is done: say so.
		d.o.Logger.Error("dashboard: dead letters changed in part, then an error", "action", action, "queue", queue,
			"done", res.Done, "missed", res.Missed, "err", err)
		d.logFailed(action, queue, res)
		return res, err
	}
	d.o.Logger.Info("dashboard: dead letters changed", "action", action, "queue", queue, "done", res.Done, "missed", res.Missed)
	d.logFailed(action, queue, res)
	return res, nil
}

// logFailed names the chosen dead letters a change did not do, and why
// (the pages give only their count).
func (d *Dashboard) logFailed(action, queue string, res dlq.Result) {
	for _, f := range res.Failed {
		d.o.Logger.Warn("dashboard: dead letter not changed", "action", action, "queue", queue, sdk.LogText("id", f.ID), "err", f.Err)
	}
	if n := res.Unnamed(); n > 0 { // (a failure names an ID for all its letters)
		d.o.Logger.Warn("dashboard: more dead letters not changed", "action", action, "queue", queue, "count", n)
	}
}

// allGone reports whether every chosen dead letter that a change did not
// do was gone already (not found): not one whose move the broker failed
// (a refused publish), nor one a stopped scan did not reach, which are
// still dead letters.
func allGone(res dlq.Result) bool {
	if res.Unnamed() > 0 {
		return false // some are not named: their reason is unknown
	}
	for _, f := range res.Failed {
		if !errors.Is(f.Err, sdk.ErrNotFound) {
			return false
		}
	}
	return true
}

// whyMissed says why chosen dead letters were not changed.
func whyMissed(gone bool) string {
	if gone {
		return "gone already"
	}
	return "gone already, or the broker failed to move them: they may still be dead letters; the dashboard's log names them"
}

// stoppedChange is the error of a redrive or purge that stopped part-way:
// it says how many dead letters were changed before the error. It unwraps
// to that error, so the page has its status.
type stoppedChange struct {
	action string
	res    dlq.Result
	err    error
}

func (e *stoppedChange) Error() string {
	verb := map[string]string{"redrive": "redriven", "purge": "purged"}[e.action]
	s := fmt.Sprintf("%s %d dead letter(s) before the error", verb, e.res.Done)
	if e.res.Missed > 0 {
		if allGone(e.res) {
			s += fmt.Sprintf(" (%d of the chosen were not %s: gone already)", e.res.Missed, verb)
		} else {
			s += fmt.Sprintf(" (%d of the chosen were not %s%s; they may still be dead letters)", e.res.Missed, verb, failureList(e.res.Failed, 3))
		}
	}
	return s + "; then: " + e.err.Error()
}

// failureList is ": " and up to limit of fs as "id: reason", and how many
// more there are; "" for none. Its text is a message's (IDs) and a broker's
// (reasons): the page escapes it, and the API sends it as JSON.
func failureList(fs []dlq.Failure, limit int) string {
	if len(fs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(": ")
	for i, f := range fs {
		if i == limit {
			fmt.Fprintf(&b, "; and %d more", len(fs)-limit)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.ID + ": " + f.Err.Error())
	}
	return b.String()
}

func (e *stoppedChange) Unwrap() error { return e.err }

// messagePage is the data of one dead letter's page.
type messagePage struct {
	Queue   string
	M       *sdk.Message
	History dlq.History
	// Headers are the first maxShownHeaders of the headers by name, name
	// and value escaped (dlq.EscapeText) and cut as the template's short
	// cuts them (maxHeaderName, maxHeaderValue runes). HeadersTotal is how
	// many the dead letter has; HeadersCut is set when a name or a value
	// shown was cut.
	Headers      [][2]string
	HeadersTotal int
	HeadersCut   bool
	// F are the dead letter's fields as shown, escaped and cut.
	F shownFields
	// APIURL is the API's copy of the dead letter, "" when its ID is too
	// long to link (maxLinkedID).
	APIURL string
	Body   string
	Kind   string // "json", "text" or "hex"
	// Shown is how many bytes of the body Body shows: all of them, or
	// maxShownBody when the body is longer (Cut is then set).
	Shown int
	Cut   bool
}

// maxShownBody is the most of a body a dead letter's page shows. Shown
// whole, a body of tens of megabytes (RabbitMQ takes up to 128 MB, the
// PostgreSQL broker more) became a page five times its size (a hex dump,
// each "<" escaped as "&lt;"), held in memory while rendered, for every
// request, and too large for a browser to show. The API gives the whole
// body.
const maxShownBody = 1 << 20

// maxShownHeaders is the most headers a dead letter's page shows, and
// maxHeaderName and maxHeaderValue the most runes of each name and value
// it shows. A broker bounds a message, not its headers: a producer outside
// berth may send thousands, or values of megabytes, and shown whole they
// made a page of as many megabytes, held in memory while rendered, for
// every request. The API gives them all.
const (
	maxShownHeaders = 100
	maxHeaderName   = 100
	maxHeaderValue  = 1000
)

// shortText is s escaped and cut to at most n runes as the template's
// "short" shows it (dlq.EscapeTextShort), and whether it was cut.
func shortText(s string, n int) (string, bool) {
	return dlq.EscapeTextCut(s, false, n)
}

// shownFields are a dead letter's fields as its page shows them: escaped
// (dlq.EscapeText; the reason on its lines) and cut to maxFieldText runes
// (the reason to maxShownReason, the class and failure times to
// maxShortField), as its headers are. A producer outside berth sets the
// ID, type, keys and correlation ID, and may forge the failure-history
// headers, at any length: shown whole, each made the page as many
// megabytes. The API gives them whole.
type shownFields struct {
	ID, Type, IdempotencyKey, Key, CorrelationID string
	Reason, Class, FirstFailure, LastFailure     string
	// Cut is set when one of them was cut.
	Cut bool
}

const (
	maxFieldText   = 1000
	maxShownReason = 4000 // a berth reason is at most sdk.MaxReasonLength bytes
	maxShortField  = 100
	// maxLinkedID is the longest ID (in bytes) a dead letter's page links
	// to the API's copy of: the link holds the ID, percent-encoded.
	maxLinkedID = 4096
)

// fieldsOf returns m's fields as its page shows them.
func fieldsOf(m *sdk.Message, h dlq.History) shownFields {
	var f shownFields
	cut := func(dst *string, s string, block bool, n int) {
		var c bool
		*dst, c = dlq.EscapeTextCut(s, block, n)
		f.Cut = f.Cut || c
	}
	cut(&f.ID, m.ID, false, maxFieldText)
	cut(&f.Type, m.Type, false, maxFieldText)
	cut(&f.IdempotencyKey, m.IdempotencyKey, false, maxFieldText)
	cut(&f.Key, m.Key, false, maxFieldText)
	cut(&f.CorrelationID, m.CorrelationID, false, maxFieldText)
	cut(&f.Reason, h.Reason, true, maxShownReason)
	cut(&f.Class, h.Class, false, maxShortField)
	cut(&f.FirstFailure, h.FirstFailure, false, maxShortField)
	cut(&f.LastFailure, h.LastFailure, false, maxShortField)
	return f
}

func (d *Dashboard) message(w http.ResponseWriter, r *http.Request) {
	queue := r.PathValue("queue")
	id, err := idOf(r)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	m, err := d.getDeadLetter(r.Context(), queue, id)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p := messagePage{Queue: queue, M: m, History: dlq.HistoryOf(m)}
	p.F = fieldsOf(m, p.History)
	if len(m.ID) <= maxLinkedID {
		p.APIURL = apiDeadLetterURL(queue, m.ID)
	}
	keys := sortedKeys(m.Headers)
	p.HeadersTotal = len(keys)
	for _, k := range keys[:min(len(keys), maxShownHeaders)] {
		name, nameCut := shortText(k, maxHeaderName)
		value, valueCut := shortText(m.Headers[k], maxHeaderValue)
		p.HeadersCut = p.HeadersCut || nameCut || valueCut
		p.Headers = append(p.Headers, [2]string{name, value})
	}
	var body []byte
	body, p.Cut = cutBody(m.Body, maxShownBody)
	p.Shown = len(body)
	p.Body, p.Kind = renderBody(body)
	d.render(w, "message", http.StatusOK, p)
}

// renderBody returns the body as pretty JSON, escaped text or a hex dump.
func renderBody(b []byte) (string, string) {
	var buf bytes.Buffer
	if json.Valid(b) && json.Indent(&buf, b, "", "  ") == nil {
		return dlq.EscapeJSONText(buf.String()), "json" // its backslashes are JSON's own escapes
	}
	if utf8.Valid(b) {
		return dlq.EscapeText(string(b), true), "text"
	}
	return hex.Dump(b), "hex"
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// showTime is the template function "at".
func showTime(t time.Time, layout string) string {
	switch {
	case t.Equal(ledger.Infinity):
		return "infinity"
	case t.Equal(ledger.NegativeInfinity):
		return "-infinity"
	}
	return t.Format(layout)
}
