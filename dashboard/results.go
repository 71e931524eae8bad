package dashboard

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// The banner a queue's page shows after a change or a pause ("redriven 12
// dead letter(s)") is the server's own record of what it did. The handler
// that did it keeps the banner's text under a random token (128 bits) and
// redirects to the queue's page with only that token in the query
// ("?result=…"); the page shows the text kept under it once, on that
// queue's page only, within resultTTL. A link cannot make the banner claim
// anything: before, its numbers and verb came from the redirect's query
// ("?done=redrive&n=5000"), which anyone could write into a link. Tokens
// live in the process: behind several dashboards without sticky sessions
// the page after a change may show no banner, never a false one.
const (
	resultTTL  = 2 * time.Minute // from the change to its page: one redirect
	maxResults = 1024            // kept at most; the oldest go first
)

// results holds the banners of changes until their page shows them.
type results struct {
	mu  sync.Mutex
	m   map[string]banner
	now func() time.Time // time.Now; tests set it
}

// banner is a result kept for the page of queue.
type banner struct {
	queue string
	text  string
	at    time.Time
}

func newResults() *results {
	return &results{m: map[string]banner{}, now: time.Now}
}

// put keeps text for queue's page and returns its token, or "" (no
// banner) for a queue name no broker accepts: such a page shows no queue,
// and the name comes from the request's path, whose length only the
// server's header limit bounds (1 MiB by default) — a thousand kept would
// hold a gigabyte. Resume answers a name no pause holds, any name, with
// "nothing changed".
func (r *results) put(queue, text string) string {
	if sdk.ValidateQueueName(queue) != nil {
		return ""
	}
	token := rand.Text()
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	var oldest string
	for k, b := range r.m {
		if now.Sub(b.at) > resultTTL {
			delete(r.m, k)
		} else if oldest == "" || b.at.Before(r.m[oldest].at) {
			oldest = k
		}
	}
	if len(r.m) >= maxResults {
		delete(r.m, oldest)
	}
	r.m[token] = banner{queue: queue, text: text, at: now}
	return token
}

// take returns the text kept under token for queue's page and forgets it,
// or "" for a token it does not hold (made up, taken already, expired) or
// kept for another queue's page (left for that page).
func (r *results) take(queue, token string) string {
	if token == "" {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.m[token]
	if !ok || b.queue != queue {
		return ""
	}
	delete(r.m, token)
	if r.now().Sub(b.at) > resultTTL {
		return ""
	}
	return b.text
}

// pauseBanner is the banner of a pause or resume: paused says which, changed
// whether it changed anything.
func pauseBanner(paused, changed bool) string {
	switch {
	case paused && changed:
		return "Queue paused: Workers that sync the pause table stop receiving from it within their interval."
	case paused:
		return "The queue was already paused: nothing changed."
	case changed:
		return "Queue resumed."
	}
	return "The queue was not paused: nothing changed."
}

// changeBanner is the banner of a redrive or purge (action) that did res.
func changeBanner(action string, res dlq.Result) string {
	verb := map[string]string{"redrive": "redriven", "purge": "purged"}[action]
	s := fmt.Sprintf("%s %d dead letter(s)", verb, res.Done)
	if res.Missed > 0 {
		s += fmt.Sprintf("; %d of the chosen were not %s (%s)", res.Missed, verb, whyMissed(allGone(res)))
	}
	if slices.ContainsFunc(res.Failed, func(f dlq.Failure) bool { return errors.Is(f.Err, dlq.ErrOverLimit) }) {
		s += "; some chosen IDs are held by more dead letters than were left of the count confirmed (a change of an ID moves every letter holding it), so they were not " + verb + ": confirm again"
	}
	if slices.ContainsFunc(res.Failed, func(f dlq.Failure) bool { return errors.Is(f.Err, dlq.ErrSharedID) }) {
		s += "; some matched dead letters share their ID with dead letters the filter did not choose (a change of an ID moves every letter holding it), so they were not " + verb + ": change those IDs by ID"
	}
	if res.Incomplete != "" {
		s += "; the broker's scan stopped before the end of the dead-letter queue, so more may match: do it again"
	}
	return s
}
