package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// Mount the dashboard in a program's own server; here a request to its JSON
// API stands in for a browser.
func ExampleNew() {
	ctx := context.Background()
	b, _ := memory.New(memory.Options{})
	defer b.Close()
	_ = b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"o1"}`)})

	d, err := dashboard.New(b, dashboard.Options{ReadOnly: true, Title: "memory"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// http.ListenAndServe("127.0.0.1:8080", d) in a program.
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/api/queues", nil))
	var v struct {
		Queues []struct {
			Queue string `json:"queue"`
			Ready int    `json:"ready"`
		} `json:"queues"`
		ReadOnly bool `json:"read_only"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &v)
	fmt.Println(rec.Code, v.Queues[0].Queue, v.Queues[0].Ready, v.ReadOnly)
	// Output:
	// 200 billing 1 true
}
