// Package sdk is the portable API of berth: the types applications use to publish
// jobs and to process them reliably on any broker that delivers at least once.
//
// Applications write a [Handler] once and run it in a [Worker] on any [Broker]
// (brokers/memory, brokers/rabbitmq, brokers/sqs, brokers/postgres). Handlers never
// acknowledge: they return an error and the Worker settles each [Delivery] exactly
// once, following this table:
//
//	handler result                     Worker action
//	nil                                Ack
//	Permanent(err)                     DeadLetter now, whatever the attempt
//	RetryAfter(err, d)                 Release(d) when the delivery supports it, else Retry(d)
//	other error, recovered panic       Retry(backoff(attempt)) while attempt < MaxAttempts, else DeadLetter
//	  (a panic whatever its value: panic(Permanent(err)) is not a verdict)
//	ran past its Timeout               as a transient error wrapping ErrJobTimeout (unless it returned nil)
//	interrupted by shutdown            Release(0): redelivered without consuming an attempt
//	lease lost (heartbeat failed)      handler ctx cancelled; not settled (another worker may own it)
//
// Brokers implement the small driver contract ([Delivery], [Publisher], [Subscriber])
// and, optionally, the capability interfaces ([QueueDeclarer], [Inspector],
// [DeadLetters], [Releaser], [Flusher]) found by type assertion. Retry loops,
// backoff and settlement live here, in one place; brokers only move bytes and
// classify errors.
//
// Package sdk imports no broker, no database driver and no OpenTelemetry SDK.
package sdk
