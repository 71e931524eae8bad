package brokerurl_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/brokerurl"
)

// TestSQSRegionContradictionIsRefused: a URL whose host names one region
// (sqs://REGION, or an AWS endpoint's host such as sqs.REGION.amazonaws.com)
// while ?region= names another was opened with ?region='s, silently: the
// requests went to the host's endpoint signed for the other region (refused
// by AWS at the first request), or to the other region's endpoint than the
// URL's host named. It is now a *ParamError naming the parameter and both
// regions, quoted, found before anything connects. The same region in
// another case is no contradiction, and neither is ?region= on a host that
// names none (an emulator).
func TestSQSRegionContradictionIsRefused(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx := context.Background()
	for _, c := range []struct{ url, host, param string }{
		{"sqs://eu-west-1?region=us-east-1", "eu-west-1", "us-east-1"},
		{"sqs://EU-WEST-1?region=us-east-1", "eu-west-1", "us-east-1"},
		{"https://sqs.eu-west-1.amazonaws.com?region=us-east-1", "eu-west-1", "us-east-1"},
		{"https://sqs.eu-west-1.amazonaws.com/?region=AP-South-1", "eu-west-1", "ap-south-1"},
		{"https://vpce-0123456789abcdef-abcdefgh.sqs.ap-south-1.vpce.amazonaws.com?region=eu-west-1", "ap-south-1", "eu-west-1"},
		{"https://eu-central-1.queue.amazonaws.com?region=us-west-2", "eu-central-1", "us-west-2"},
	} {
		err, ok := wantParamError(t, ctx, c.url, "region")
		if !ok {
			continue
		}
		var pe *brokerurl.ParamError
		errors.As(err, &pe)
		for _, want := range []string{strconv.Quote(c.host), strconv.Quote(c.param)} {
			if !strings.Contains(pe.Reason, want) {
				t.Errorf("Open(%q): reason %q does not name %s", c.url, pe.Reason, want)
			}
		}
	}
	for raw, want := range map[string]string{
		"sqs://EU-WEST-1?region=eu-west-1":                     "eu-west-1",
		"https://sqs.eu-west-1.amazonaws.com?region=EU-West-1": "eu-west-1",
		"http://127.0.0.1:4566?region=eu-west-3":               "eu-west-3",
		"https://sqs.example.com?region=us-west-2":             "us-west-2",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if err != nil {
			t.Errorf("Open(%s): %v", raw, err)
			continue
		}
		if sb, ok := b.(*sqs.Broker); !ok {
			t.Errorf("%s opened %T", raw, b)
		} else if got := sb.Client().Options().Region; got != want {
			t.Errorf("Open(%s): region %q, want %q", raw, got, want)
		}
		_ = b.Close()
	}
}
