package doctor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/sdk"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.Cleanup(func(code int) {
			if code != 0 {
				reportSnapshots()
			}
			if err := dropDB(); err != nil {
				fmt.Fprintf(os.Stderr, "doctor tests: dropping their database: %v\n", err)
				code = 1
			}
			os.Exit(code)
		}),
	)
}

func suffix() string {
	var p [5]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// open opens a broker from rawURL, closed when the test ends.
func open(t *testing.T, rawURL string) sdk.Broker {
	t.Helper()
	b, err := brokerurl.Open(testCtx(t), rawURL, brokerurl.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// find returns the findings of check id on queue ("" for any queue).
func find(fs []doctor.Finding, id, queue string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range fs {
		if f.ID == id && (queue == "" || f.Queue == queue) {
			out = append(out, f)
		}
	}
	return out
}

// expect fails unless check id on queue has exactly severity sev.
func expect(t *testing.T, fs []doctor.Finding, id, queue string, sev doctor.Severity) {
	t.Helper()
	got := find(fs, id, queue)
	if len(got) == 0 {
		t.Errorf("%s on %q: no finding; have %s", id, queue, ids(fs))
		return
	}
	for _, f := range got {
		if f.Severity != sev {
			t.Errorf("%s on %q: %s (%s; %s), want %s", id, queue, f.Severity, f.Summary, f.Evidence, sev)
		}
		if f.Summary == "" || f.Evidence == "" {
			t.Errorf("%s on %q: no summary or evidence: %+v", id, queue, f)
		}
		if (f.Severity == doctor.Warn || f.Severity == doctor.Error) && f.Fix == "" {
			t.Errorf("%s on %q: %s without a fix", id, queue, f.Severity)
		}
	}
}

// clean fails on any warning or error among fs.
func clean(t *testing.T, fs []doctor.Finding) {
	t.Helper()
	for _, f := range fs {
		if f.Severity == doctor.Warn || f.Severity == doctor.Error {
			t.Errorf("on berth's defaults: %s %s on %q: %s (%s)", f.Severity, f.ID, f.Queue, f.Summary, f.Evidence)
		}
	}
}

func ids(fs []doctor.Finding) string {
	var s []string
	for _, f := range fs {
		s = append(s, string(f.Severity)+":"+f.ID+"@"+f.Queue)
	}
	return strings.Join(s, " ")
}
