// Package monitoring holds no code: it is the home of the Grafana dashboard
// (grafana/berth.json) and the Prometheus alert rules
// (prometheus/berth-alerts.yml, with their promtool unit tests in
// prometheus/berth-alerts.test.yml) over the metrics berth exports, and of
// the tests that keep them honest: every metric and label they name must be
// one that package telemetry or ledger creates, under the name the
// OpenTelemetry Prometheus exporter gives it (dots become underscores, the
// unit "s" adds _seconds, counters end in _total, histograms are read as
// _bucket, _sum and _count); rates are taken of counters only; every
// instrument berth exports has a panel; every alert points at a section of
// RUNBOOK.md. With promtool on PATH (Debian's prometheus package, which
// scripts/services installs) the rules, their unit tests and the
// dashboard's queries are also checked by Prometheus itself.
package monitoring
