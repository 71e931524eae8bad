package sdk

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"
)

// DeliveryCapReporter is implemented by brokers that dead-letter a message on
// their own once it has been delivered a number of times, counting the
// deliveries that Retry causes (the "poison cap" of ARCHITECTURE.md,
// "Attempts, leases and heartbeats"): memory (MaxDeliveries), SQS (the
// redrive policy's maxReceiveCount), PostgreSQL (max_attempts) and JetStream
// (MaxDeliveries). RabbitMQ does not: its x-delivery-limit counts only the
// redeliveries of one copy (a crashed consumer), while Retry publishes a new
// copy, so it never cuts the Worker's retries short.
//
// [NewWorker] compares it with the retry policies (see [CheckConfig]).
type DeliveryCapReporter interface {
	// MaxDeliveries is the most deliveries of one message the broker hands
	// out; 0 means no cap.
	MaxDeliveries() int
}

// ErrConfigConflict is matched (errors.Is) by the [*ConfigError] NewWorker
// returns under [WorkerOptions.StrictConfig].
var ErrConfigConflict = errors.New("berth: worker options contradict the broker")

// Stable identifiers of the conflicts [CheckConfig] reports. They also name
// the matching checks of package doctor and its runbook entries.
const (
	// ConflictMaxAttemptsOverCap: a retry policy's MaxAttempts is above the
	// broker's poison cap, so the broker would dead-letter the job first,
	// with "max deliveries exceeded" instead of the handler's error.
	ConflictMaxAttemptsOverCap = "worker.max-attempts-over-broker-cap"
	// ConflictHeartbeatOverLease: the heartbeat comes later than half the
	// broker's own lease, so a lease can run out before it is extended.
	ConflictHeartbeatOverLease = "worker.heartbeat-over-broker-lease"
	// ConflictTimeoutOverLease: heartbeats are disabled and a handler may run
	// longer than the broker's lease, so the job is delivered again while it
	// still runs.
	ConflictTimeoutOverLease = "worker.timeout-over-lease-without-heartbeat"
)

// ConfigConflict is one contradiction between a Worker's options and what
// its broker reports.
type ConfigConflict struct {
	// ID is stable (the Conflict* constants).
	ID string
	// Type is the job type whose policy or timeout conflicts; "" for the
	// Worker's default.
	Type string
	// Message says what is wrong, with the numbers.
	Message string
	// Fix says what to change.
	Fix string
}

// String is the message and the fix on one line.
func (c ConfigConflict) String() string { return c.ID + ": " + c.Message + " (fix: " + c.Fix + ")" }

// ConfigError is returned by [NewWorker] with [WorkerOptions.StrictConfig]
// when [CheckConfig] finds conflicts. It matches [ErrConfigConflict].
type ConfigError struct {
	Conflicts []ConfigConflict
}

// Error lists the conflicts.
func (e *ConfigError) Error() string {
	parts := make([]string, len(e.Conflicts))
	for i, c := range e.Conflicts {
		parts[i] = c.String()
	}
	return "berth: worker: options contradict the broker: " + strings.Join(parts, "; ")
}

// Is reports whether target is [ErrConfigConflict].
func (e *ConfigError) Is(target error) bool { return target == ErrConfigConflict }

// CheckConfig returns the contradictions between opts and what sub reports
// about itself ([DeliveryCapReporter], [LeaseReporter]), the checks
// [NewWorker] runs:
//
//   - a retry policy (Retry or RetryByType) whose MaxAttempts is above the
//     broker's poison cap ([ConflictMaxAttemptsOverCap]);
//   - a HeartbeatInterval longer than half the broker's lease
//     ([ConflictHeartbeatOverLease]);
//   - heartbeats disabled while a handler timeout (Timeout or
//     TimeoutByType; none counts as unbounded) is longer than the broker's
//     lease ([ConflictTimeoutOverLease]).
//
// It returns an error for options NewWorker refuses anyway.
func CheckConfig(sub Subscriber, opts WorkerOptions) ([]ConfigConflict, error) {
	if lr, ok := sub.(LeaseReporter); ok && opts.Lease == 0 {
		opts.Lease = lr.Lease()
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return checkConfig(sub, o), nil
}

// checkConfig is CheckConfig on options with their defaults applied.
func checkConfig(sub Subscriber, o WorkerOptions) []ConfigConflict {
	var out []ConfigConflict
	if cr, ok := sub.(DeliveryCapReporter); ok {
		if limit := cr.MaxDeliveries(); limit > 0 {
			check := func(typ string, p RetryPolicy) {
				if p.MaxAttempts <= limit {
					return
				}
				who := "Retry.MaxAttempts"
				if typ != "" {
					who = fmt.Sprintf("RetryByType[%q].MaxAttempts", typ)
				}
				out = append(out, ConfigConflict{
					ID:   ConflictMaxAttemptsOverCap,
					Type: typ,
					Message: fmt.Sprintf("%s is %d but the broker dead-letters a message after %d deliveries: attempts %d to %d never run",
						who, p.MaxAttempts, limit, limit+1, p.MaxAttempts),
					Fix: fmt.Sprintf("raise the broker's cap to at least %d (memory/JetStream MaxDeliveries, SQS MaxReceiveCount, PostgreSQL MaxAttempts) or lower %s to %d; meanwhile the Worker dead-letters at attempt %d with the handler's error",
						p.MaxAttempts, who, limit, limit),
				})
			}
			check("", o.Retry)
			for _, t := range sortedKeys(o.RetryByType) {
				check(t, o.RetryByType[t])
			}
		}
	}
	lr, ok := sub.(LeaseReporter)
	if !ok || lr.Lease() <= 0 {
		return out
	}
	lease := lr.Lease()
	if o.HeartbeatInterval > 0 && o.HeartbeatInterval > lease/2 {
		out = append(out, ConfigConflict{
			ID: ConflictHeartbeatOverLease,
			Message: fmt.Sprintf("HeartbeatInterval %s (Lease %s) is longer than half the broker's lease %s: a delivery's lease can run out before its first extension and the job run twice",
				o.HeartbeatInterval, o.Lease, lease),
			Fix: fmt.Sprintf("leave WorkerOptions.Lease and HeartbeatInterval at their defaults (the broker's lease and a third of it), or set HeartbeatInterval to at most %s", lease/2),
		})
	}
	if o.HeartbeatInterval < 0 {
		check := func(typ string, d time.Duration) {
			if d > 0 && d <= lease {
				return
			}
			who, what := "Timeout", "no limit"
			if typ != "" {
				who = fmt.Sprintf("TimeoutByType[%q]", typ)
			}
			if d > 0 {
				what = d.String()
			}
			out = append(out, ConfigConflict{
				ID:   ConflictTimeoutOverLease,
				Type: typ,
				Message: fmt.Sprintf("heartbeats are disabled and %s is %s, longer than the broker's lease %s: a slower job is delivered again while it still runs",
					who, what, lease),
				Fix: fmt.Sprintf("enable the heartbeat (HeartbeatInterval 0 or positive) or set %s to at most %s", who, lease),
			})
		}
		check("", o.Timeout)
		for _, t := range sortedKeys(o.TimeoutByType) {
			check(t, o.TimeoutByType[t])
		}
	}
	return out
}

// applyConfig reports the conflicts of a new Worker: an error under
// StrictConfig, else one warning each. It returns the broker's poison cap
// (0: none), at which the Worker dead-letters a transient failure itself so
// that the dead letter keeps the handler's error.
func applyConfig(sub Subscriber, o WorkerOptions) (int, error) {
	conflicts := checkConfig(sub, o)
	if len(conflicts) > 0 && o.StrictConfig {
		return 0, &ConfigError{Conflicts: conflicts}
	}
	for _, c := range conflicts {
		o.Logger.Warn("berth: worker options contradict the broker",
			slog.String("queue", o.Queue), slog.String("check", c.ID), slog.String("type", c.Type),
			slog.String("problem", c.Message), slog.String("fix", c.Fix))
	}
	if cr, ok := sub.(DeliveryCapReporter); ok {
		return max(cr.MaxDeliveries(), 0), nil
	}
	return 0, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
