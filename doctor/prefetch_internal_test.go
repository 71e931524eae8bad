package doctor

import (
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
)

// TestPrefetchUsesWorkerPrefetch: rabbitmq.prefetch compares the URL's
// prefetch with the Worker's real capacity, Concurrency + its Prefetch
// (WorkerPrefetch), and the automatic prefetch with what the broker sets:
// that capacity, at most rabbitmq.DefaultPrefetch. Before, it took the
// Worker's Prefetch for Concurrency (printing Concurrency twice): a prefetch
// that fits a Worker with a larger Prefetch was reported above its
// capacity, one above the capacity of a Worker with a smaller Prefetch
// passed, and an automatic prefetch capped below Concurrency passed.
func TestPrefetchUsesWorkerPrefetch(t *testing.T) {
	for _, c := range []struct {
		name     string
		o        Options
		sev      Severity
		evidence []string // substrings of the evidence
	}{
		{"automatic", Options{Concurrency: 4, WorkerPrefetch: 20}, OK,
			[]string{"Concurrency 4 + Prefetch 20 = 24"}},
		{"automatic default", Options{Concurrency: 4}, OK,
			[]string{"Concurrency 4 + Prefetch 4 = 8"}},
		{"automatic capped", Options{Concurrency: 40, WorkerPrefetch: 40}, OK,
			[]string{"Concurrency 40 + Prefetch 40 = 80", "capped at 64"}},
		{"automatic capped below concurrency", Options{Concurrency: 100}, Warn,
			[]string{"Concurrency 100 + Prefetch 100", "64 < Concurrency 100"}},
		{"fits a large worker prefetch", Options{Concurrency: 8, WorkerPrefetch: 16, Prefetch: 20}, OK,
			[]string{"Concurrency 8 ≤ prefetch 20 ≤ Concurrency + Prefetch 24"}},
		{"above a small worker prefetch", Options{Concurrency: 8, WorkerPrefetch: 2, Prefetch: 12}, Warn,
			[]string{"prefetch 12 > Concurrency 8 + Prefetch 2 = 10"}},
		{"below concurrency", Options{Concurrency: 8, Prefetch: 2}, Warn,
			[]string{"prefetch 2 < Concurrency 8"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := prefetch(c.o.withDefaults())
			if len(fs) != 1 || fs[0].ID != "rabbitmq.prefetch" {
				t.Fatalf("prefetch = %+v, want one rabbitmq.prefetch finding", fs)
			}
			f := fs[0]
			if f.Severity != c.sev {
				t.Errorf("severity %s (%s; %s), want %s", f.Severity, f.Summary, f.Evidence, c.sev)
			}
			for _, e := range c.evidence {
				if !strings.Contains(f.Evidence, e) {
					t.Errorf("evidence %q does not say %q", f.Evidence, e)
				}
			}
			if f.Severity != OK && f.Fix == "" {
				t.Errorf("%s finding without a fix: %+v", f.Severity, f)
			}
		})
	}
}

// TestNegativeWorkerPrefetchInvalid: a negative WorkerPrefetch, which
// NewWorker refuses, is reported as options that do not validate.
func TestNegativeWorkerPrefetchInvalid(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	o := Options{WorkerPrefetch: -1}
	fs := workerConfig(b, o.withDefaults(), o)
	if len(fs) == 0 || fs[0].ID != "worker.options" || fs[0].Severity != Error || !strings.Contains(fs[0].Evidence, "Prefetch") {
		t.Fatalf("workerConfig with WorkerPrefetch -1 = %+v, want a worker.options error naming Prefetch", fs)
	}
}
