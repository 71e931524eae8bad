package doctor

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// rabbit4DeliveryLimit is the delivery limit RabbitMQ 4.0 and later give a
// quorum queue declared without x-delivery-limit (and without a
// delivery-limit policy); -1 disables it. Before 4.0 there was none.
const rabbit4DeliveryLimit = 20

// serverMajor returns the major version of a RabbitMQ version string
// ("4.0.5" → 4), 0 when it is empty or does not parse.
func serverMajor(version string) int {
	major, _, _ := strings.Cut(strings.TrimSpace(version), ".")
	n, err := strconv.Atoi(major)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// serverVersion is the RabbitMQ server's version as doctor read it.
type serverVersion struct {
	announced string // as the server announced it; "" when it did not, or it could not be read
	unread    error  // why it could not be read (it timed out); nil when it was read
}

// serverText describes the server's version for evidence.
func serverText(v serverVersion) string {
	switch {
	case v.unread != nil:
		return "server version could not be read (" + v.unread.Error() + "; read as older than 4.0)"
	case serverMajor(v.announced) == 0:
		return "server version not announced (read as older than 4.0)"
	}
	return "RabbitMQ " + v.announced
}

// deliveryLimit is the rabbitmq.delivery-limit finding of a queue of type
// qtype with args, on the RabbitMQ of version.
//
// A quorum queue's delivery limit is the server's poison cap: a message
// returned unsettled (its worker crashed or stopped, its connection was
// lost) more times than the limit is dead-lettered by the server (dropped
// without a dead-letter exchange). berth counts those deliveries as
// attempts (Attempt() adds x-delivery-count), so a limit below the
// Workers' MaxAttempts removes a job before its retry policy ends. Without
// x-delivery-limit a queue has no limit before RabbitMQ 4.0 and the default
// of 20 from 4.0 on; x-delivery-limit -1 disables it on 4.x.
func deliveryLimit(qtype string, args map[string]any, version serverVersion, o Options) Finding {
	ev := "arguments " + argsText(args)
	if qtype != "quorum" {
		return Finding{ID: "rabbitmq.delivery-limit", Severity: Warn, Summary: "classic queues have no delivery limit: a message that crashes its consumer is redelivered forever (berth counts its attempts, but only the Worker can stop it)",
			Evidence: ev, Fix: "use a quorum queue with x-delivery-limit"}
	}
	ev += "; " + serverText(version)
	v4 := serverMajor(version.announced) >= 4
	limit, hasLimit := args["x-delivery-limit"].(int64)
	var deliveries int64 // the server dead-letters at the delivery after this many
	var source string
	switch {
	case hasLimit && limit >= 0:
		deliveries, source = limit+1, fmt.Sprintf("x-delivery-limit %d", limit)
	case !hasLimit && v4:
		deliveries, source = rabbit4DeliveryLimit+1, fmt.Sprintf("no x-delivery-limit: RabbitMQ 4's default delivery limit %d applies", rabbit4DeliveryLimit)
	default: // none before 4.0, or disabled (-1)
		return Finding{ID: "rabbitmq.delivery-limit", Severity: Error, Summary: "quorum queue without a delivery limit: a message that crashes its consumer is redelivered forever",
			Evidence: ev + policyNote, Fix: "set x-delivery-limit (berth: max_deliveries, default 10) by redeclaring or with a policy (delivery-limit)"}
	}
	ev += "; " + source + policyNote
	if int64(o.MaxAttempts) > deliveries {
		return Finding{ID: "rabbitmq.delivery-limit", Severity: Warn,
			Summary:  fmt.Sprintf("the server dead-letters a job after %d deliveries, below the Workers' MaxAttempts %d: a job returned unsettled that often (crashed or stopped workers, lost connections; berth counts them as attempts) is removed by the server before berth's retry policy ends", deliveries, o.MaxAttempts),
			Evidence: ev + fmt.Sprintf("; MaxAttempts %d", o.MaxAttempts),
			Fix: fmt.Sprintf("lower MaxAttempts to %d, or give the queue x-delivery-limit %d or more (berth: max_deliveries ≥ MaxAttempts; arguments cannot change on a queue that exists: declare a new one and shovel the messages, or set a delivery-limit policy where the argument is absent)",
				deliveries, o.MaxAttempts-1)}
	}
	if !hasLimit {
		return Finding{ID: "rabbitmq.delivery-limit", Severity: Info,
			Summary:  fmt.Sprintf("quorum queue without x-delivery-limit: RabbitMQ 4 dead-letters poison messages after %d deliveries (its default delivery limit %d), not berth's max_deliveries", deliveries, rabbit4DeliveryLimit),
			Evidence: ev + fmt.Sprintf("; MaxAttempts %d", o.MaxAttempts),
			Fix:      "nothing to do unless poison messages should stop sooner: declare with x-delivery-limit (berth: max_deliveries) or set a delivery-limit policy"}
	}
	return Finding{ID: "rabbitmq.delivery-limit", Severity: OK, Summary: fmt.Sprintf("poison messages are dead-lettered after %d deliveries", deliveries),
		Evidence: ev + fmt.Sprintf("; MaxAttempts %d", o.MaxAttempts)}
}

// queueLimits are the rabbitmq.queue-limits findings of a main (ready)
// queue: arguments that make the server remove jobs that never ran
// (x-message-ttl, x-max-length or x-max-length-bytes with the default
// overflow drop-head) or the queue itself (x-expires). berth declares none
// of them on a main queue; someone else's declare or an older deployment
// may have. Policies setting the same are not visible over AMQP.
func queueLimits(args map[string]any) []Finding {
	var fs []Finding
	add := func(sev Severity, summary, evidence, fix string) {
		fs = append(fs, Finding{ID: "rabbitmq.queue-limits", Severity: sev, Summary: summary, Evidence: evidence, Fix: fix})
	}
	redeclare := "a queue's arguments cannot change: declare a new queue without it (berth DeclareQueue), move the workers and shovel the messages, then delete the old one"
	if v, ok := args["x-message-ttl"]; ok {
		add(Error, fmt.Sprintf("x-message-ttl %v%s on a job queue: a job that waits longer than that expires without running (dead-lettered with reason expired, or dropped without a dead-letter exchange)", v, msText(v)),
			fmt.Sprintf("x-message-ttl=%v", v), redeclare+"; for a time limit on a job use its own deadline in the handler")
	}
	if v, ok := args["x-expires"]; ok {
		add(Warn, fmt.Sprintf("x-expires %v%s on a job queue: the server deletes the queue, with every job in it, once it has been unused that long — no consumer, no basic.get, no redeclare; publishes do not count (workers stopped or scaled to zero) — and publishes to it fail until something declares it again, empty", v, msText(v)),
			fmt.Sprintf("x-expires=%v", v), redeclare)
	}
	var caps []string
	for _, k := range []string{"x-max-length", "x-max-length-bytes"} {
		if v, ok := args[k]; ok {
			caps = append(caps, fmt.Sprintf("%s=%v", k, v))
		}
	}
	if len(caps) > 0 {
		overflow, set := args["x-overflow"]
		ov := fmt.Sprint(overflow)
		ev := strings.Join(caps, " ")
		if set {
			ev += " x-overflow=" + ov
		} else {
			ev += " (no x-overflow: drop-head)"
			ov = "drop-head"
		}
		switch ov {
		case "reject-publish", "reject-publish-dlx":
			add(Warn, "a length limit with x-overflow "+ov+": publishes to a full queue are refused (berth's Publish returns an error)",
				ev, "remove the limit (redeclare: "+redeclare+"), or size it for the worst backlog and alert on publish errors")
		default:
			add(Error, "a length limit with x-overflow "+ov+": when the queue is full the server drops (or dead-letters) its oldest jobs, which never run",
				ev, redeclare+"; if a bound is wanted, x-overflow reject-publish makes the publisher see it")
		}
	}
	if len(fs) == 0 {
		add(OK, "no message TTL, queue expiry or length limit on the queue", "no x-message-ttl, x-expires, x-max-length or x-max-length-bytes argument"+policyNote, "")
	}
	return fs
}

// msText renders a millisecond argument as a duration, " (1m0s)", or "" when
// it is not a number.
func msText(v any) string {
	if n, ok := v.(int64); ok {
		return " ms (" + (time.Duration(n) * time.Millisecond).String() + ")"
	}
	return ""
}
