package health_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/health"
	"github.com/berthq/berth/sdk"
)

// Serve a Worker's liveness and readiness for the platform's probes.
func Example() {
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()
	w, _ := sdk.NewWorker(broker, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "billing"})

	mux := http.NewServeMux()
	mux.Handle("GET /livez", health.Live(w))
	mux.Handle("GET /readyz", health.Ready(w))

	// Before Run the Worker is live (starting) but not ready.
	for _, path := range []string{"/livez", "/readyz"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /livez 200
	// /readyz 503
}
