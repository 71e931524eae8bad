// Package health serves the liveness and readiness of berth Workers over
// HTTP, for a platform's probes (Kubernetes livenessProbe and
// readinessProbe, a load balancer's health check):
//
//	mux.Handle("GET /livez", health.Live(billing, emails))
//	mux.Handle("GET /readyz", health.Ready(billing, emails))
//
// Each handler answers 200 when every Worker passes and 503 when one does
// not, with a JSON [Report] naming each Worker's queue, state and evidence
// (see [sdk.Health] for the meaning of live and ready). The body carries
// broker error texts: serve it on an internal port, not to the internet.
//
// Probe advice: readiness may drop for one failed Receive (a broker
// restart), so give the readiness probe a failureThreshold of a few periods;
// liveness drops only when Run has returned, which a restart of the process
// fixes.
package health

import (
	"encoding/json"
	"net/http"

	"github.com/berthq/berth/sdk"
)

// Status values of a [Report].
const (
	StatusOK          = "ok"
	StatusUnavailable = "unavailable"
)

// Report is the JSON body of the handlers.
type Report struct {
	// Status is StatusOK when every Worker passed the check, else
	// StatusUnavailable.
	Status string `json:"status"`
	// Check is "live" or "ready".
	Check string `json:"check"`
	// Workers are the Workers' health, in the order they were given.
	Workers []sdk.Health `json:"workers"`
}

// Check returns the report of check ("live" or "ready"; anything else is
// treated as "ready") over workers. A report over no Workers is OK.
func Check(check string, workers ...*sdk.Worker) Report {
	if check != "live" {
		check = "ready"
	}
	r := Report{Status: StatusOK, Check: check, Workers: make([]sdk.Health, 0, len(workers))}
	for _, w := range workers {
		h := w.Health()
		pass := h.Ready
		if check == "live" {
			pass = h.Live
		}
		if !pass {
			r.Status = StatusUnavailable
		}
		r.Workers = append(r.Workers, h)
	}
	return r
}

// Live returns a handler that answers 200 when every Worker is live, else
// 503, with the [Report] as JSON.
func Live(workers ...*sdk.Worker) http.Handler { return handler("live", workers) }

// Ready returns a handler that answers 200 when every Worker is ready, else
// 503, with the [Report] as JSON.
func Ready(workers ...*sdk.Worker) http.Handler { return handler("ready", workers) }

func handler(check string, workers []*sdk.Worker) http.Handler {
	workers = append([]*sdk.Worker(nil), workers...)
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			rw.Header().Set("Allow", "GET, HEAD")
			http.Error(rw, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		r := Check(check, workers...)
		body, err := json.Marshal(r)
		if err != nil { // sdk.Health holds strings, bools, ints and times only
			http.Error(rw, "encoding the report: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := rw.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		code := http.StatusOK
		if r.Status != StatusOK {
			code = http.StatusServiceUnavailable
		}
		rw.WriteHeader(code)
		if req.Method == http.MethodGet {
			rw.Write(append(body, '\n'))
		}
	})
}
