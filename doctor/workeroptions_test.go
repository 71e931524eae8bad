package doctor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/doctor"
)

// TestNegativeWorkerOptionsInvalid: the Worker options doctor describes
// that NewWorker refuses (a negative MaxAttempts, DrainTimeout or
// SettleTimeout: sdk.ErrInvalidOptions) are reported as options that do
// not validate, not checked as if they were the defaults: a deployment
// doctor passed would fail to start. Before, doctor took each for its
// default and reported the retry policy and the drain as fine.
func TestNegativeWorkerOptionsInvalid(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for name, o := range map[string]doctor.Options{
		"MaxAttempts":   {MaxAttempts: -1},
		"DrainTimeout":  {DrainTimeout: -time.Second},
		"SettleTimeout": {SettleTimeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			o.Queues = []string{"q"}
			fs, err := doctor.Run(testCtx(t), b, o)
			if err != nil {
				t.Fatal(err)
			}
			expect(t, fs, "worker.options", "", doctor.Error)
			for _, f := range find(fs, "worker.options", "") {
				if !strings.Contains(f.Evidence, name) {
					t.Errorf("worker.options evidence %q does not name %s", f.Evidence, name)
				}
			}
		})
	}
}
