// Package telemetry traces and measures berth jobs with OpenTelemetry, on every
// broker alike: one trace from publish to the last delivery, a correlation ID in
// every handler's context and every log record, and the metrics an operator
// needs (queue depth, retries, dead letters, durations, leases).
//
// It uses only the OpenTelemetry API; the application chooses the SDK and the
// exporters and passes its providers in [Options].
//
// Wiring, once per process:
//
//	tel, err := telemetry.New(telemetry.Options{
//		TracerProvider: tp,
//		MeterProvider:  mp,
//		Queues:         []telemetry.InspectedQueue{{Inspector: broker, Queue: "billing"}},
//	})
//	defer tel.Close()
//	pub := tel.Publisher(broker) // publish through pub: producer spans, trace headers, correlation IDs
//	// pub is an sdk.AsyncPublisher when broker is one (RabbitMQ, JetStream):
//	// an outbox relay through it keeps PublishAsync. For other brokers put the
//	// batching pool inside, never outside: tel.Publisher(sdk.NewAsyncPublisher(
//	// broker, opts)) gives each message its own caller's trace, where a pool
//	// around pub would publish a whole batch under its first caller's.
//	w, err := sdk.NewWorker(broker, handler, sdk.WorkerOptions{
//		Queue:     "billing",
//		Observers: []sdk.Observer{tel}, // consumer spans, metrics, correlation ID in the handler's context
//	})
//	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(os.Stderr, nil)))
//
// # Propagation
//
// The trace context travels in [sdk.Message.Headers] as W3C "traceparent" and
// "tracestate", with W3C "baggage", so it crosses every broker that carries
// headers (all of berth's). The correlation ID travels in
// [sdk.Message.CorrelationID]. [Inject] and [Extract] are the shared code for
// anything else that moves messages (an outbox relay, a redrive tool).
//
// # Spans
//
// Spans follow the OpenTelemetry messaging semantic conventions
// (semconv v1.43.0): a PRODUCER span "send <queue>" per published message (for
// a batch, a PRODUCER span "create <queue>" per message and a CLIENT span
// "send <queue>" linked to them), and a CONSUMER span "process <queue>" per
// delivery, a child of the message's creation span and linked to it (set
// [Options.LinkOnly] to start a new trace per delivery instead). A retried job
// therefore shows as one trace: the send span with one process span per
// attempt. Process spans carry messaging.system, messaging.destination.name,
// messaging.operation.name and .type, messaging.message.id,
// messaging.message.conversation_id (the correlation ID), and berth's own:
// berth.job.type, berth.delivery.attempt, berth.settlement.action,
// berth.retry.delay (seconds), berth.dead_letter.reason, error.type (the
// [sdk.ErrorClass] of the handler's error). A handler the Worker interrupts
// is no handler error, whatever it returns: one whose lease was lost (its
// context's cause is [sdk.ErrLeaseLost]) is reported as the outcome
// lease_lost — berth.settlement.action lease_lost, status "lease lost",
// counted in berth.lease.expirations — and one handed back at shutdown
// ([sdk.ErrShutdown]) as its release, neither with error.type nor in
// berth.job.errors. Error texts (the dead-letter reason, a failed
// settlement's error, the "exception" event of the cause) pass through
// [sdk.SanitizeReason], as the dead-letter reason header does: valid UTF-8, at
// most [sdk.MaxReasonLength] bytes. The message's own text (its ID,
// correlation ID and, on send spans, type), which a producer outside berth may
// write with any bytes and of any length, is written as a log record writes it
// ([sdk.LogText]: valid UTF-8, at most [sdk.MaxLogTextLength] bytes): an OTLP
// exporter refuses a whole batch with one invalid string, or one past the
// receiver's size limit.
//
// # Metrics
//
// See [Observer] for the instruments. berth.job.type comes from the message,
// so its values are bounded: the declared [Options.JobTypes] and the first
// [Options.MaxJobTypes] (default 100) others seen keep their name, the rest
// (and any undeclared type that is not valid UTF-8 or is longer than
// [sdk.MaxLogTextLength] bytes) are counted as [OtherJobType]. Close leaves
// the delivery counters registered so that a final export after it still
// reports them.
//
// The counters only other berth packages
// can see are fed through their hooks:
//
//	idempotency.Options{Observer: tel.Idempotency()}             // duplicates, conflicts, every guard event
//	rowlock.Options{Observe: tel.RowLockObserved}                // row-lock wait time
//	optimistic.Retrier{OnConflict: tel.VersionConflictHook("orders")} // optimistic-lock conflicts
//
// or directly through [Observer.DuplicateSuppressed],
// [Observer.IdempotencyConflict], [Observer.VersionConflict] and
// [Observer.LockWait], reachable inside a handler with [FromContext].
package telemetry
