package brokerurl_test

import (
	"context"
	"fmt"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/sdk"
)

func ExampleOpen() {
	ctx := context.Background()
	b, err := brokerurl.Open(ctx, "mem://?lease=10s", brokerurl.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	_ = b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"o1"}`)})
	st, _ := b.(sdk.Inspector).Stats(ctx, "billing")
	fmt.Println("ready:", st.Ready)

	_, err = brokerurl.Open(ctx, "amqp://guest:secret@localhost/?prefetch=many", brokerurl.Options{})
	fmt.Println(err)
	// Output:
	// ready: 1
	// brokerurl: amqp URL: parameter "prefetch": want an integer >= 0
}
