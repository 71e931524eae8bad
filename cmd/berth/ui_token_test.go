package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// uiTestToken is a token of the length berth ui accepts.
const uiTestToken = "t0ken-for-the-ui-tests"

// berth ui refuses a token (-token or BERTH_UI_TOKEN) shorter than 16 bytes
// as a usage error (exit 2) that says why and does not show it, before it
// opens the broker; on loopback too, where a token is optional, since one
// given is one relied on. Before, a token of 3 characters was served.
func TestUIRefusesAShortToken(t *testing.T) {
	for _, c := range []struct {
		name, flag, env string
	}{
		{"-token", "abc", ""},
		{"BERTH_UI_TOKEN", "", "s3cret"},
		{"15 bytes", strings.Repeat("k", 15), ""},
		{"-token over a long BERTH_UI_TOKEN", "short-one", uiTestToken},
	} {
		stderr := &syncbuf.Buffer{}
		opened := false
		e := env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr,
			getenv: func(k string) string { return map[string]string{"BERTH_UI_TOKEN": c.env}[k] },
			open: func(context.Context, string) (sdk.Broker, error) {
				opened = true
				return nil, errors.New("the broker was opened")
			},
			listening: func(string) { t.Errorf("%s: berth ui listened", c.name) },
		}
		args := []string{"ui", "-url", "mem://", "-addr", "127.0.0.1:0"}
		if c.flag != "" {
			args = append(args, "-token", c.flag)
		}
		code := run(context.Background(), args, e)
		short := c.flag
		if short == "" {
			short = c.env
		}
		msg := stderr.String()
		if code != exitUsage || !strings.Contains(msg, "at least 16 bytes") {
			t.Errorf("%s: exit %d, want %d with the reason: %s", c.name, code, exitUsage, msg)
		}
		if opened {
			t.Errorf("%s: the broker was opened", c.name)
		}
		if strings.Contains(msg, short) {
			t.Errorf("%s: stderr shows the token: %s", c.name, msg)
		}
	}
}
