package jetstream

import "time"

// SeqID is the ID of a stored message that has none berth can use.
func SeqID(stream string, seq uint64, stored time.Time) string { return seqID(stream, seq, stored) }

// SetRedriveHook sets the hook RedriveDeadLetters runs between storing a
// dead letter's copy and taking the letter; the returned func restores it.
func SetRedriveHook(f func(seq uint64)) (restore func()) {
	old := redriveHook
	redriveHook = f
	return func() { redriveHook = old }
}

// SetPurgeHook sets the hook PurgeDeadLetters runs between reading the
// dead-letter stream's state and purging it; the returned func restores it.
func SetPurgeHook(f func()) (restore func()) {
	old := purgeHook
	purgeHook = f
	return func() { purgeHook = old }
}

// DeadSubject returns the prefix of queue's dead-letter subjects: a dead
// letter of it is stored on DeadSubject(queue) + "." + a token.
func (b *Broker) DeadSubject(queue string) string { return b.names(queue).dead }

// SetDeclareLockHook sets the hook a declaration runs with the name of the
// queue's lock stream before each attempt to take it (held false) and
// once it holds it (held true); the returned func restores it.
func SetDeclareLockHook(f func(lockStream string, held bool)) (restore func()) {
	old := declareLockHook
	declareLockHook = f
	return func() { declareLockHook = old }
}

// SetRedrivePage sets the page of RedriveDeadLetters with no ids; the
// returned func restores it.
func SetRedrivePage(n int) (restore func()) {
	old := redrivePage
	redrivePage = n
	return func() { redrivePage = old }
}

// SetPullHook sets the hook a pull runs after each message it reads; the
// returned func restores it.
func SetPullHook(f func(*Broker)) (restore func()) {
	old := pullHook
	pullHook = f
	return func() { pullHook = old }
}

// Closing returns the channel Close closes once it has begun.
func (b *Broker) Closing() <-chan struct{} { return b.closing }

// SetRenewHook sets the hook ExtendLease's timer runs just before it sends
// a +WPI; the returned func restores it.
func SetRenewHook(f func()) (restore func()) {
	old := renewHook
	renewHook = f
	return func() { renewHook = old }
}

// SetDeadLetterHook sets the hook DeadLetter runs once its copy is stored,
// before it acknowledges the original; the returned func restores it.
func SetDeadLetterHook(f func()) (restore func()) {
	old := deadLetterHook
	deadLetterHook = f
	return func() { deadLetterHook = old }
}

// SetClosePullHook sets the hook a pull that Close interrupts runs once it
// has read what its answer held, before it ends its subscription, with the
// consumer it pulls from (held reports what the subscription's channel
// holds); the returned func restores it.
func SetClosePullHook(f func(b *Broker, consumer string, held func() int)) (restore func()) {
	old := closePullHook
	closePullHook = f
	return func() { closePullHook = old }
}
