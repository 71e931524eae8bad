package dashboard

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"unicode/utf8"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// The JSON API. Documents only ever gain fields; errors are
// {"error": "..."} with the HTTP status that fits.

// writeJSON answers v as JSON, with the characters that would act on a
// terminal (a curl of the API) or reorder the text written as \u escapes
// (see dlq.EscapeJSON): encoding/json escapes only the C0 controls.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(dlq.EscapeJSON(b), '\n'))
}

func (d *Dashboard) apiFail(w http.ResponseWriter, r *http.Request, err error) {
	err = d.timedOut(r, err)
	status := statusOf(err)
	d.logFailure(r, status, err)
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func (d *Dashboard) apiQueues(w http.ResponseWriter, r *http.Request) {
	rows, err := d.queueRows(r.Context())
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"queues": rows, "read_only": d.o.ReadOnly})
}

// maxAPILimit bounds the dead letters of one page of the JSON API.
const maxAPILimit = 1000

type apiList struct {
	Queue            string       `json:"queue"`
	TotalDeadLetters *int64       `json:"total_dead_letters"`
	Matched          int          `json:"matched"`
	Complete         bool         `json:"complete"`
	Incomplete       string       `json:"incomplete,omitempty"` // why complete is false
	Offset           int          `json:"offset"`
	Limit            int          `json:"limit"`
	NextOffset       *int         `json:"next_offset"`
	Messages         []apiMessage `json:"messages"`
}

// maxListBody is the most of each body, in bytes, that a listing of the
// API (GET /api/queues/{queue}/dead-letters) carries. Whole, a page of 100
// dead letters of 256 KiB was a 25 MB answer built in memory for each
// request (and a page may have 1,000). The dead letter's own document
// (apiMessage.URL) gives the whole body.
const maxListBody = 4 << 10

// apiMessage is a dead letter as the API gives it: dlq.Message, whose Body
// in a listing is the first maxListBody bytes of the body at most (cut
// before a character, not inside it; in base64 when the whole body is not
// UTF-8), and in the dead letter's own document all of it.
type apiMessage struct {
	dlq.Message
	// BodySize is the length of the whole body in bytes (before base64).
	BodySize int `json:"body_size"`
	// BodyCut is set when Body is only the start of the body.
	BodyCut bool `json:"body_cut"`
	// URL is the API path of the dead letter, whole body included.
	URL string `json:"url"`
	// FieldsCut is set when a listing cut a field other than the ID and
	// the body (a header value, the type, a key, the correlation ID, what
	// the dead-letter history reads from headers) to maxListField bytes.
	FieldsCut bool `json:"fields_cut,omitempty"`
}

// maxListField is the most of each message field other than the ID and the
// body, in bytes, that a listing carries: a producer outside berth may
// write headers of 100 KiB (a broker bounds a message, not a field), and a
// page of 1,000 would carry them all.
const maxListField = 1 << 10

// apiView returns the API's form of queue's dead letter m with at most limit
// bytes of its body (all of it when limit < 0).
func apiView(queue string, m *sdk.Message, limit int) apiMessage {
	body, cut := cutBody(m.Body, limit)
	short := *m // a shallow copy: dlq.View converts only the part shown
	short.Body = body
	v := apiMessage{Message: dlq.View(&short), BodySize: len(m.Body), BodyCut: cut, URL: apiDeadLetterURL(queue, m.ID)}
	if cut && v.BodyEncoding == "text" && !utf8.Valid(m.Body) {
		// The start of a body that is not UTF-8 can be: the encoding is
		// the whole body's, as in the dead letter's own document.
		v.Body, v.BodyEncoding = base64.StdEncoding.EncodeToString(body), "base64"
	}
	if limit >= 0 {
		v.cutFields(maxListField)
	}
	return v
}

// cutFields cuts every field of v but the ID and the body to at most limit
// bytes (see maxListField), setting FieldsCut when one was.
func (v *apiMessage) cutFields(limit int) {
	cut := func(s *string) {
		b, c := cutBody(*s, limit)
		if c {
			*s, v.FieldsCut = b+"…", true
		}
	}
	for _, f := range []*string{&v.Type, &v.IdempotencyKey, &v.Key, &v.CorrelationID,
		&v.DeadLetter.Reason, &v.DeadLetter.Class, &v.DeadLetter.Queue, &v.DeadLetter.FirstFailure, &v.DeadLetter.LastFailure} {
		cut(f)
	}
	if v.Headers == nil {
		return
	}
	var short map[string]string // a copy: the map is the broker's message's
	for k, val := range v.Headers {
		nk, c := cutBody(k, limit)
		nv, vc := cutBody(val, limit)
		if !c && !vc {
			continue
		}
		if short == nil {
			short = maps.Clone(v.Headers)
		}
		delete(short, k)
		if c {
			nk += "…"
		}
		if vc {
			nv += "…"
		}
		short[nk] = nv
		v.FieldsCut = true
	}
	if short != nil {
		v.Headers = short
	}
}

// cutBody returns b (a body, or a field's text) whole when it has at most
// limit bytes (or limit < 0), else its first limit bytes, fewer by up to
// utf8.UTFMax so as to cut before a character rather than inside it, and
// true.
func cutBody[T ~string | ~[]byte](b T, limit int) (T, bool) {
	if limit < 0 || len(b) <= limit {
		return b, false
	}
	n := limit
	for n > limit-utf8.UTFMax && n > 0 && !utf8.RuneStart(b[n]) {
		n-- // cut before a character, not inside it
	}
	return b[:n], true
}

func (d *Dashboard) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	queue := r.PathValue("queue")
	q := r.URL.Query()
	_, f, err := parseFilter(q)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	offset, err := intParam(q, "offset", 0)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	// The default is the page size, within the bound a client may ask for.
	limit, err := intParam(q, "limit", min(d.o.PageSize, maxAPILimit))
	if err != nil || limit == 0 || limit > maxAPILimit {
		d.apiFail(w, r, &badRequest{fmt.Sprintf("limit: want 1 to %d", maxAPILimit)})
		return
	}
	l, err := dlq.List(r.Context(), d.deadLetters(), queue, f, offset, limit, dlq.Options{})
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	v := apiList{Queue: queue, Matched: l.Matched, Complete: l.Complete, Incomplete: l.Incomplete, Offset: offset, Limit: limit, Messages: make([]apiMessage, 0, len(l.Messages))}
	if l.Total >= 0 {
		v.TotalDeadLetters = &l.Total
	}
	if l.Next >= 0 {
		v.NextOffset = &l.Next
	}
	for _, m := range l.Messages {
		v.Messages = append(v.Messages, apiView(queue, m, maxListBody))
	}
	writeJSON(w, http.StatusOK, v)
}

func (d *Dashboard) apiDeadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := idOf(r)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	queue := r.PathValue("queue")
	m, err := d.getDeadLetter(r.Context(), queue, id)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apiView(queue, m, -1)) // the whole body
}

// apiChangeRequest is the body of POST /api/queues/{queue}/{redrive|purge}.
type apiChangeRequest struct {
	IDs []string `json:"ids"`
	// IDsBase64 are more IDs, in base64: an ID that is not UTF-8 cannot be
	// a JSON string (the listing gives it as id_base64).
	IDsBase64 []string `json:"ids_base64"`
	All       bool     `json:"all"` // every match of the filter; required when ids is empty, refused with ids
	Type      string   `json:"type"`
	Class     string   `json:"class"`
	Reason    string   `json:"reason"`
	OlderThan string   `json:"older_than"`
	NewerThan string   `json:"newer_than"`
	Limit     int      `json:"limit"` // at most this many (0: no bound)
	DryRun    bool     `json:"dry_run"`
}

type apiFailure struct {
	ID       string `json:"id"`
	IDBase64 string `json:"id_base64,omitempty"` // only when ID is not UTF-8, as in a listing
	Error    string `json:"error"`
}

func failure(id, err string) apiFailure {
	f := apiFailure{ID: id, Error: err}
	if !utf8.ValidString(id) {
		f.IDBase64 = base64.StdEncoding.EncodeToString([]byte(id))
	}
	return f
}

type apiChangeResult struct {
	Action   string `json:"action"`
	Queue    string `json:"queue"`
	DryRun   bool   `json:"dry_run"`
	Matched  int    `json:"matched"`
	Done     int    `json:"done"`
	Missed   int    `json:"missed"`
	Complete bool   `json:"complete"`
	// Incomplete says why the scan stopped before the end of the
	// dead-letter queue: more may match (absent when it did not).
	Incomplete string       `json:"incomplete,omitempty"`
	Failed     []apiFailure `json:"failed"`
	// Error is the error that stopped the change part-way, with the
	// status it means; done and missed count what happened before it.
	Error string `json:"error,omitempty"`
}

func (d *Dashboard) apiChange(w http.ResponseWriter, r *http.Request) {
	if d.o.ReadOnly {
		d.apiFail(w, r, errReadOnly)
		return
	}
	action, queue := r.PathValue("action"), r.PathValue("queue")
	if action != "redrive" && action != "purge" {
		d.apiFail(w, r, &badRequest{"the action is redrive or purge"})
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		d.apiFail(w, r, &badRequest{"want Content-Type: application/json"})
		return
	}
	var req apiChangeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		d.apiFail(w, r, &badRequest{"the body does not parse: " + err.Error()})
		return
	}
	for _, v := range req.IDsBase64 {
		id, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			d.apiFail(w, r, &badRequest{"ids_base64: want IDs in base64"})
			return
		}
		req.IDs = append(req.IDs, string(id))
	}
	switch {
	case len(req.IDs) == 0 && !req.All:
		d.apiFail(w, r, &badRequest{`choose dead letters: "ids" (or "ids_base64"), or "all": true for every match of the filter`})
		return
	case len(req.IDs) > 0 && req.All:
		// Which did the client mean? Widening a change of a few dead
		// letters to every match is not a guess to make.
		d.apiFail(w, r, &badRequest{`choose dead letters: "ids" or "all": true, not both`})
		return
	}
	if req.Limit < 0 {
		d.apiFail(w, r, &badRequest{"limit: want an integer >= 0"})
		return
	}
	_, f, err := parseFilter(url.Values{"type": {req.Type}, "class": {req.Class}, "reason": {req.Reason}, "older_than": {req.OlderThan}, "newer_than": {req.NewerThan}})
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	if !req.All {
		f.IDs = req.IDs
	}
	out := apiChangeResult{Action: action, Queue: queue, DryRun: req.DryRun, Failed: []apiFailure{}}
	if req.DryRun { // a read: Options.Timeout bounds it
		ctx, cancel := context.WithTimeout(r.Context(), d.o.Timeout)
		defer cancel()
		r = r.WithContext(ctx)
		s, _, missing, err := dlq.Preview(ctx, d.deadLetters(), queue, f, dlq.Options{Limit: req.Limit}, 0)
		if err != nil {
			d.apiFail(w, r, err)
			return
		}
		// Missed counts the letters the change would leave, their IDs held
		// by dead letters the filter does not choose too, as it would.
		out.Matched, out.Complete, out.Incomplete, out.Missed = s.Matched, s.Complete, s.Incomplete, len(missing)+s.Withheld
		for _, id := range missing {
			out.Failed = append(out.Failed, failure(id, "not found"))
		}
		// And names their IDs, as the change would (at most
		// dlq.MaxFailures of them).
		for _, fl := range s.WithheldIDs {
			out.Failed = append(out.Failed, failure(fl.ID, fl.Err.Error()))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	res, err := d.apply(r.Context(), queue, action, f, req.Limit)
	if err != nil && res.Done == 0 && res.Missed == 0 {
		d.apiFail(w, r, err) // nothing was changed
		return
	}
	out.Matched, out.Done, out.Missed, out.Complete, out.Incomplete = res.Matched, res.Done, res.Missed, res.Complete, res.Incomplete
	for _, fl := range res.Failed {
		out.Failed = append(out.Failed, failure(fl.ID, fl.Err.Error()))
	}
	status := http.StatusOK
	if err != nil { // stopped part-way: the counts say what was done before the error
		status = statusOf(err)
		out.Error = err.Error()
	}
	writeJSON(w, status, out)
}

var errNoLedger = errors.New("job state needs a ledger (berth ui -db with the ledger's tables, or the PostgreSQL broker)")
