package health_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/health"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// probe GETs url and decodes the report.
func probe(t *testing.T, url string) (int, health.Report) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r health.Report
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("GET %s: decoding the report: %v", url, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	return resp.StatusCode, r
}

// waitProbe polls url until it answers code, failing after 15s.
func waitProbe(t *testing.T, url string, code int) health.Report {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, r := probe(t, url)
		if got == code {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d, want %d; report %+v", url, got, code, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// viaProxy starts integration's fault proxy in front of the server of
// rawURL (defaultPort when the URL has none) and returns the URL through it.
func viaProxy(t *testing.T, rawURL, defaultPort string) (*integration.Proxy, *url.URL) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), defaultPort)
	}
	proxy := integration.StartProxy(t, target)
	u.Host = proxy.Addr()
	return proxy, u
}

// server serves Live and Ready of workers on a real HTTP server.
func server(t *testing.T, workers ...*sdk.Worker) (live, ready string) {
	mux := http.NewServeMux()
	mux.Handle("/livez", health.Live(workers...))
	mux.Handle("/readyz", health.Ready(workers...))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/livez", srv.URL + "/readyz"
}

// runServed serves w's probes (see server) and runs w until stop, which
// cancels Run and returns its error (later calls return the same). A test
// defers stop where the Worker must stop (before the broker closes); a
// cleanup stops it too, should the test end before. With waitReady,
// runServed returns once /readyz answers 200.
func runServed(ctx context.Context, t *testing.T, w *sdk.Worker, waitReady bool) (live, ready string, stop func() error) {
	t.Helper()
	live, ready = server(t, w)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	if waitReady {
		waitProbe(t, ready, http.StatusOK)
	}
	return live, ready, stop
}

// TestHandlersFollowTheWorkers serves two Workers on the memory broker: 503
// on readiness until both run, 200 while they do, 503 again as soon as one
// drains, and 503 on liveness once its Run returned.
func TestHandlersFollowTheWorkers(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	noop := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	a, err := sdk.NewWorker(b, noop, sdk.WorkerOptions{Queue: "a", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.NewWorker(b, noop, sdk.WorkerOptions{Queue: "c", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	live, ready := server(t, a, c)

	if code, r := probe(t, ready); code != http.StatusServiceUnavailable || r.Status != health.StatusUnavailable || r.Check != "ready" || len(r.Workers) != 2 {
		t.Errorf("ready before Run = %d %+v", code, r)
	}
	if code, r := probe(t, live); code != http.StatusOK || r.Status != health.StatusOK || r.Check != "live" {
		t.Errorf("live before Run = %d %+v", code, r)
	}

	ctx := context.Background()
	actx, stopA := context.WithCancel(ctx)
	cctx, stopC := context.WithCancel(ctx)
	doneA, doneC := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- a.Run(actx) }()
	go func() { doneC <- c.Run(cctx) }()
	defer func() { stopC(); <-doneC }()

	r := waitProbe(t, ready, http.StatusOK)
	if r.Workers[0].Queue != "a" || r.Workers[1].Queue != "c" || r.Workers[0].State != sdk.StateRunning {
		t.Errorf("report %+v, want queues a and c running, in order", r)
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	code, r := probe(t, ready)
	if code != http.StatusServiceUnavailable || r.Workers[0].Ready || !r.Workers[1].Ready {
		t.Errorf("ready with a stopped = %d %+v", code, r)
	}
	code, r = probe(t, live)
	if code != http.StatusServiceUnavailable || r.Workers[0].State != sdk.StateStopped || !r.Workers[1].Live {
		t.Errorf("live with a stopped = %d %+v", code, r)
	}
}

// TestHandlerMethods: HEAD answers the status without a body; other methods
// are refused.
func TestHandlerMethods(t *testing.T) {
	h := health.Live()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/livez", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 {
		t.Errorf("HEAD = %d with %d bytes", rec.Code, rec.Body.Len())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/livez", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST = %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}
