package sqs

import "time"

// SetScanLimits shortens b's dead-letter scan hold and its bound on held
// letters, so that tests can run scans longer than a hold, and past the
// bound, in seconds.
func SetScanLimits(b *Broker, hold time.Duration, maxHeld int) {
	b.scanHold, b.scanMax = hold, maxHeld
}
