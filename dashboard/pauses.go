package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Pauses is the shared pause table that Workers apply with pause.Sync;
// package pause's *PG implements it. With Options.Pauses set the dashboard
// shows which queues are paused and, unless read-only, pauses and resumes
// them.
type Pauses interface {
	PausedSince(ctx context.Context) (map[string]time.Time, error)
	Pause(ctx context.Context, queue string) (bool, error)
	Resume(ctx context.Context, queue string) (bool, error)
}

// pausedSince returns the paused queues, or nil without Options.Pauses.
func (d *Dashboard) pausedSince(ctx context.Context) (map[string]time.Time, error) {
	if d.o.Pauses == nil {
		return nil, nil
	}
	return d.o.Pauses.PausedSince(ctx)
}

var errNoPauses = errors.New("the dashboard has no pause table (berth ui -db)")

// setPause pauses or resumes a queue: POST /queues/{queue}/pause|resume
// redirects to the queue's page; the /api form answers JSON.
func (d *Dashboard) setPause(paused, api bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fail := d.fail
		if api {
			fail = d.apiFail
		}
		switch {
		case d.o.ReadOnly:
			fail(w, r, errReadOnly)
			return
		case d.o.Pauses == nil:
			fail(w, r, &badRequest{errNoPauses.Error()})
			return
		}
		queue := r.PathValue("queue")
		var changed bool
		var err error
		if paused {
			changed, err = d.o.Pauses.Pause(r.Context(), queue)
		} else {
			changed, err = d.o.Pauses.Resume(r.Context(), queue)
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		action := map[bool]string{true: "paused", false: "resumed"}[paused]
		d.o.Logger.Info("dashboard: queue "+action, "queue", queue, "changed", changed)
		if api {
			writeJSON(w, http.StatusOK, map[string]any{"queue": queue, "paused": paused, "changed": changed})
			return
		}
		// The page says what happened, nothing included.
		token := d.results.put(queue, pauseBanner(paused, changed))
		http.Redirect(w, r, "/queues/"+url.PathEscape(queue)+"?result="+token, http.StatusSeeOther)
	}
}
