package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/berthq/berth/outbox"
)

// An operator's look at the rows the relay gave up on: list them with their
// last error, then put one back in line once the cause is fixed (or Discard
// it). The error text came from a broker about an application's message:
// quote it before showing it.
func ExampleOutbox_Parked() {
	ctx := context.Background()
	var box *outbox.Outbox // from outbox.New
	if box == nil {
		return // the example needs a database
	}
	parked, err := box.Parked(ctx, 50)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, p := range parked {
		fmt.Printf("%d %s %s attempts=%d %s\n", p.ID, p.Queue, p.Message.ID, p.Attempts, strconv.Quote(p.LastError))
	}
	if len(parked) > 0 && strings.Contains(parked[0].LastError, "too large") {
		n, err := box.Requeue(ctx, parked[0].ID)
		fmt.Println("requeued", n, err)
	}
}
