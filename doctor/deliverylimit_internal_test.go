package doctor

import (
	"strings"
	"testing"
)

// TestDeliveryLimitByServerVersion tests the rabbitmq.delivery-limit
// decision on server versions the test server does not run (it runs 3.x):
// RabbitMQ 4.0 and later give a quorum queue without x-delivery-limit a
// default limit of 20, which removes a job before a retry policy of more
// than 21 attempts ends, and -1 disables the limit. The version is the one
// the server announces in its connection properties
// (TestRabbitMQDeliveryLimitBelowMaxAttempts reads it from the real server).
func TestDeliveryLimitByServerVersion(t *testing.T) {
	quorum := map[string]any{"x-queue-type": "quorum"}
	limited := func(n int64) map[string]any { return map[string]any{"x-queue-type": "quorum", "x-delivery-limit": n} }
	for _, c := range []struct {
		name        string
		version     string
		args        map[string]any
		maxAttempts int
		want        Severity
		text        string
	}{
		{"3.x without a limit", "3.13.7", quorum, 5, Error, "redelivered forever"},
		{"unknown version without a limit", "", quorum, 5, Error, "not announced"},
		{"4.x default covers the attempts", "4.0.5", quorum, 5, Info, "after 21 deliveries (its default delivery limit 20)"},
		{"4.x default below the attempts", "4.1.0", quorum, 25, Warn, "after 21 deliveries, below the Workers' MaxAttempts 25"},
		{"4.x limit disabled", "4.0.5", limited(-1), 5, Error, "redelivered forever"},
		{"explicit limit covers the attempts", "4.0.5", limited(9), 10, OK, "after 10 deliveries"},
		{"explicit limit below the attempts", "3.13.7", limited(3), 5, Warn, "lower MaxAttempts to 4"},
		{"classic", "4.0.5", map[string]any{}, 5, Warn, "classic queues have no delivery limit"},
	} {
		qtype, _ := c.args["x-queue-type"].(string)
		if qtype == "" {
			qtype = "classic"
		}
		f := deliveryLimit(qtype, c.args, serverVersion{announced: c.version}, Options{MaxAttempts: c.maxAttempts}.withDefaults())
		if f.Severity != c.want || f.ID != "rabbitmq.delivery-limit" {
			t.Errorf("%s: %s %s, want %s (%s; %s)", c.name, f.ID, f.Severity, c.want, f.Summary, f.Evidence)
		}
		if all := f.Summary + " " + f.Evidence + " " + f.Fix; !strings.Contains(all, c.text) {
			t.Errorf("%s: %q not in %q", c.name, c.text, all)
		}
	}
}

func TestServerMajor(t *testing.T) {
	for v, want := range map[string]int{"4.0.5": 4, "3.10.8": 3, "10.1": 10, "": 0, "x.1": 0, "-1.0": 0, " 4.2.0 ": 4} {
		if got := serverMajor(v); got != want {
			t.Errorf("serverMajor(%q) = %d, want %d", v, got, want)
		}
	}
}

// TestQueueExpiryText: RabbitMQ deletes a queue with x-expires once it has
// been unused for that long, and "used" is a consumer, a basic.get or a
// redeclare: a queue that is only published to (workers stopped) is
// deleted, with its jobs, and the publishes after it fail (berth publishes
// with the mandatory flag). The summary said only "no consumer".
func TestQueueExpiryText(t *testing.T) {
	fs := queueLimits(map[string]any{"x-expires": int64(3600000)})
	if len(fs) != 1 || fs[0].Severity != Warn {
		t.Fatalf("%+v", fs)
	}
	for _, want := range []string{"1h0m0s", "with every job in it", "publishes do not count", "publishes to it fail"} {
		if !strings.Contains(fs[0].Summary, want) {
			t.Errorf("%q not in %q", want, fs[0].Summary)
		}
	}
}
