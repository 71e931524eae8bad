package monitoring

import (
	"reflect"
	"strings"
	"testing"
)

// TestScanPromQL pins what the scanner finds, so that a query it misreads
// cannot pass the export checks by accident.
func TestScanPromQL(t *testing.T) {
	for _, tc := range []struct {
		expr   string
		uses   []use
		labels []string
		funcs  []string
	}{
		{
			expr: `histogram_quantile(0.99, sum by (le, berth_job_type) (rate(messaging_process_duration_seconds_bucket{messaging_destination_name=~"$queue"}[$__rate_interval])))`,
			uses: []use{{"messaging_process_duration_seconds_bucket", "rate"}}, labels: []string{"le", "berth_job_type", "messaging_destination_name"},
			funcs: []string{"histogram_quantile", "sum", "rate"},
		},
		{
			expr:   `sum(berth_queue_depth{berth_queue_state="ready"}) by (messaging_destination_name) > 0 unless on (messaging_destination_name) rate(messaging_client_consumed_messages_total[10m]) > 0`,
			uses:   []use{{"berth_queue_depth", "sum"}, {"messaging_client_consumed_messages_total", "rate"}},
			labels: []string{"berth_queue_state", "messaging_destination_name", "messaging_destination_name"}, funcs: []string{"sum", "rate"},
		},
		{
			expr: `{__name__="berth_worker_in_flight", job='a"b'} offset 5m # a comment naming not_a_metric`,
			uses: []use{{"berth_worker_in_flight", ""}}, labels: []string{"job"},
		},
		{
			expr: "max without (instance) (berth_queue_oldest_age_seconds) / 1e3 > bool 2",
			uses: []use{{"berth_queue_oldest_age_seconds", "max"}}, labels: []string{"instance"}, funcs: []string{"max"},
		},
	} {
		p, err := scanPromQL(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if !reflect.DeepEqual(p.uses, tc.uses) || !reflect.DeepEqual(p.labels, tc.labels) || !reflect.DeepEqual(p.funcs, tc.funcs) {
			t.Errorf("%s:\n got uses %v labels %v funcs %v\nwant uses %v labels %v funcs %v", tc.expr, p.uses, p.labels, p.funcs, tc.uses, tc.labels, tc.funcs)
		}
	}
	for _, bad := range []string{`rate(x[5m]`, `x{a="b"`, `x{a}`, `sum(x))`, `x{a="b}`} {
		if _, err := scanPromQL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestCheckCatchesMistakes: the catalogue check refuses an unknown metric,
// a label berth does not set, the rate of a gauge, a raw counter and an
// unknown function.
func TestCheckCatchesMistakes(t *testing.T) {
	c := newCatalogue(t)
	for expr, want := range map[string]string{
		`rate(berth_job_retry_total[5m])`:                                    "not one berth exports",
		`sum by (queue) (rate(berth_job_retries_total[5m]))`:                 "label queue",
		`rate(berth_queue_depth[5m])`:                                        "rate of gauge",
		`sum(berth_job_dead_letters_total)`:                                  "without rate",
		`histogram_quantil(0.9, rate(berth_retry_delay_seconds_bucket[5m]))`: "unknown function",
		`messaging_process_duration_seconds > 1`:                             "not one berth exports",
	} {
		errs := strings.Join(c.check(expr), "; ")
		if !strings.Contains(errs, want) {
			t.Errorf("%s: errors %q, want one containing %q", expr, errs, want)
		}
	}
	for _, good := range []string{
		`sum by (messaging_destination_name) (rate(berth_job_retries_total[5m]))`,
		`sum(berth_job_dead_letters_total unless berth_job_dead_letters_total offset 15m)`, // a new series: its first event
	} {
		if errs := c.check(good); len(errs) != 0 {
			t.Errorf("%s refused: %v", good, errs)
		}
	}
}
