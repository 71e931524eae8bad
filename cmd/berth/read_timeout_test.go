package main

import (
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
)

// TestReadCommandsDefaultTimeout: "berth stats" and "berth dlq list" (and
// the other commands that only read) had no default -timeout: on an SQS
// endpoint that takes connections and never answers (the AWS SDK's HTTP
// client has no response timeout) they hung for ever. They now give up
// after a default -timeout (1m; shortened here), exit 1 and say it was
// the timeout and how to change it; with -watch it bounds each refresh.
func TestReadCommandsDefaultTimeout(t *testing.T) {
	defer func(d time.Duration) { readTimeout = d }(readTimeout)
	readTimeout = time.Second
	addr := integration.SilentServer(t)
	sqsURL := "http://" + addr + "?region=us-east-1"
	dbURL := "postgres://berth@" + addr + "/app?sslmode=disable"
	gaveUp := func(cmd string) string {
		return "berth " + cmd + ": gave up after 1s (-timeout, by default 1s for " + cmd + "; -timeout 0: no limit): "
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "billing"}, gaveUp("stats") + "stats billing: "},
		{[]string{"stats", "billing", "-watch"}, "berth stats: a refresh of -watch got no answer within 1s (the default -timeout of stats, for each refresh; -timeout bounds the whole watch instead): stats billing: "},
		{[]string{"stats", "billing", "-timeout", "1500ms"}, "berth stats: gave up after 1.5s (-timeout): stats billing: "},
		{[]string{"dlq", "list", "billing"}, gaveUp("dlq list")},
		{[]string{"dlq", "list", "billing", "-reason", "x"}, gaveUp("dlq list")},
		{[]string{"dlq", "show", "billing", "some-id"}, gaveUp("dlq show")},
		{[]string{"jobs", "-db", dbURL}, gaveUp("jobs")},
		{[]string{"job", "show", "some-id", "-db", dbURL}, gaveUp("job show")},
		{[]string{"outbox", "list", "-db", dbURL}, gaveUp("outbox list")},
		{[]string{"queue", "paused", "-db", dbURL}, gaveUp("queue paused")},
	} {
		done := make(chan result, 1)
		go func() { done <- cliOn(t, sqsURL, tc.args...) }()
		var r result
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("berth %s is still running on a server that does not answer", strings.Join(tc.args, " "))
		}
		if r.code != exitError || !strings.Contains(r.err, tc.want) {
			t.Errorf("berth %s on a silent server: exit %d, stderr %q; want exit 1 and %q", strings.Join(tc.args, " "), r.code, r.err, tc.want)
		}
	}
}

// TestChangesHaveNoDefaultTimeout: a redrive of a large dead-letter queue
// may take long; the commands that change keep no default -timeout (ui
// neither); the usage of -timeout says which have one.
func TestChangesHaveNoDefaultTimeout(t *testing.T) {
	for _, cmd := range commands() {
		reads := map[string]bool{"stats": true, "dlq list": true, "dlq show": true, "outbox list": true, "job show": true,
			"jobs": true, "queue paused": true, "doctor": true}[cmd.name]
		if reads != (cmd.timeout > 0) {
			t.Errorf("%s: default -timeout %s", cmd.name, cmd.timeout)
		}
	}
	if u := newCLI(env{}).fs.Lookup("timeout").Usage; !strings.Contains(u, "default 1m for the commands that only read") {
		t.Errorf("the usage of -timeout does not give its default: %s", u)
	}
	for cmd, want := range map[string]string{"stats": "-timeout is 1m0s unless given (with -watch: each refresh",
		"jobs": "-timeout is 1m0s unless given.", "dlq redrive": "-timeout is no limit unless given."} {
		if r := cliOn(t, "mem://", append([]string{"help"}, strings.Fields(cmd)...)...); r.code != exitOK || !strings.Contains(r.out, want) {
			t.Errorf("berth help %s: exit %d, no %q in\n%s", cmd, r.code, want, r.out)
		}
	}
}
