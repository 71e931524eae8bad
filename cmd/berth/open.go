package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berthq/berth/sdk"
)

// errNoURL is returned when neither -url nor BERTH_URL is set.
var errNoURL = errors.New("no broker URL: give -url or set BERTH_URL")

// open connects to the broker named by kind. Errors never include the URL.
func open(ctx context.Context, kind, url string) (sdk.Broker, error) {
	if url == "" {
		return nil, errNoURL
	}
	switch strings.ToLower(kind) {
	default:
		return nil, fmt.Errorf("unknown broker %q (want rabbitmq, sqs or postgres)", kind)
	}
}
