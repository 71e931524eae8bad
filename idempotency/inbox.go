package idempotency

import (
	"context"
	"fmt"
	"strings"

	"github.com/berthq/berth/sdk"
)

// InboxEvent is an event received from another system (a webhook, a message
// from a foreign broker): its ID, unique at its source, names it.
type InboxEvent struct {
	Source  string // e.g. "stripe"; namespaces the ID
	ID      string // the source's event ID; required
	Type    string // e.g. "payment_intent.succeeded"
	Payload []byte // fingerprinted: the same ID with another payload conflicts
}

// Inbox records consumed external events in the guard's store so that each
// is applied once, however often it is delivered. Keys are
// "inbox:<source>:<id>", with every "%" in the source written "%25" and
// every ":" "%3A", so that two events never share a key: without the
// escape, source "shop" with ID "eu:1" and source "shop:eu" with ID "1"
// would, and the second would be dropped as a duplicate. A source without
// either character is written as it is.
type Inbox struct{ g *Guard }

// Inbox returns an inbox on g's store, in g's mode.
func (g *Guard) Inbox() *Inbox { return &Inbox{g: g} }

// Key returns the idempotency key under which e is recorded.
func (in *Inbox) Key(e InboxEvent) string {
	return "inbox:" + inboxSource.Replace(e.Source) + ":" + e.ID
}

// inboxSource escapes an event's source in its key (see [Inbox]).
var inboxSource = strings.NewReplacer("%", "%25", ":", "%3A")

// Process applies fn to e unless e was already processed. It returns
// processed=true when fn ran and its effect was recorded, false for a
// duplicate; the errors are those of [Guard.Do] (an event without an ID is a
// permanent [MissingKeyError]).
func (in *Inbox) Process(ctx context.Context, e InboxEvent, fn func(ctx context.Context) error) (processed bool, err error) {
	if e.ID == "" {
		in.g.event(ctx, EventMissingKey, e.Type)
		return false, sdk.Permanent(permanentMissing(e))
	}
	op := Operation{Key: in.Key(e), JobType: e.Type, Fingerprint: FingerprintOf(e.Type, e.Payload)}
	ran, err := in.g.Do(ctx, op, fn)
	if err != nil {
		return false, err
	}
	return ran, nil
}

func permanentMissing(e InboxEvent) error {
	return fmt.Errorf("inbox event from %q: %w", e.Source, &MissingKeyError{Type: e.Type})
}
