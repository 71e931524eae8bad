package sqs

import (
	"context"
	"fmt"

	"github.com/berthq/berth/sdk"
)

// DeleteDeadLetters deletes the dead letters with the given IDs (berth IDs
// or SQS MessageIds; every letter holding a berth ID, as a redrive by ID
// moves every one) from queue's dead-letter queue and returns how many it
// deleted; with no IDs it deletes nothing ([Broker.PurgeDeadLetters] deletes
// them all). It scans the dead-letter queue, holding what it sees, to its
// end (until it has found every ID when all are SQS MessageIds; a scan that
// fills once every ID was found deletes what it found), and only then
// deletes: when an ID is not found it
// deletes nothing and returns an error wrapping [sdk.ErrNotFound] that names
// the missing IDs; a scan that has to hold more than 10,000 other dead
// letters stops with a [*ScanError] and deletes nothing either, as does one
// that ends with IDs missing while another reader holds dead letters
// invisible (the missing may be among them). A chosen
// letter whose hold lapsed (another receiver took it) is not deleted and not
// counted. The berth CLI and dashboard use it for a filtered purge.
func (b *Broker) DeleteDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	if b.closed.Load() {
		return 0, sdk.ErrClosed
	}
	if len(ids) == 0 {
		return 0, nil
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	found := make(map[string]bool, len(ids))
	bySQSID := 0 // IDs found as an SQS MessageId: unique, no other letter has it
	deleted := 0
	var unseen *ScanError
	err := b.withScan(ctx, queue, func(ctx context.Context, s *scan) error {
		s.whole = true
		var chosen []*letter
		// Every letter holding a wanted ID is deleted, as a redrive by ID
		// moves every one (a producer may reuse a berth ID): the scan goes
		// on to the end of the queue, unless every ID was an SQS
		// MessageId, or the scan is full once every ID was found (the
		// letters found are deleted, as before; others holding an ID may
		// lie past the scan).
		for bySQSID < len(want) {
			if s.full() {
				if len(found) < len(want) {
					return s.incomplete()
				}
				break
			}
			ls, err := s.next(ctx)
			if err != nil {
				return err
			}
			if len(ls) == 0 {
				// The end of the queue: some IDs are missing, or among
				// the letters another reader holds.
				if len(found) < len(want) {
					unseen = s.unseenError()
				}
				break
			}
			for _, l := range ls {
				hit := false
				if want[l.msg.ID] {
					found[l.msg.ID], hit = true, true
				}
				if want[l.sqsID] && !found[l.sqsID] {
					found[l.sqsID], hit = true, true
					bySQSID++
				}
				if hit {
					chosen = append(chosen, l)
				}
				l.msg = nil
			}
		}
		if len(found) < len(want) {
			return nil // nothing is deleted unless every ID was found
		}
		if err := s.renew(ctx); err != nil {
			return err
		}
		live := chosen[:0]
		for _, l := range chosen {
			if l.handle != "" {
				live = append(live, l)
			}
		}
		gone, err := b.remove(ctx, s.dlq, live)
		s.forget(gone)
		deleted = len(gone)
		return err
	})
	if err != nil || deleted > 0 {
		return deleted, err
	}
	var missing []string
	for _, id := range ids {
		if !found[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 && unseen != nil {
		return 0, unseen // the missing may be among them
	}
	if len(missing) > 0 {
		return 0, fmt.Errorf("berth/sqs: dead letters %s of %s: %w", joinErrorText(missing), queue, sdk.ErrNotFound)
	}
	return 0, nil
}
