package berthtest

import (
	"context"
	"sync"

	"github.com/berthq/berth/sdk"
)

// AsyncPublisher is an [sdk.AsyncPublisher] whose confirmations the test
// gives: PublishAsync returns a result that stays pending until
// [AsyncPublisher.Resolve] (or, after [AsyncPublisher.ResolveAtOnce],
// resolves before it returns). Use it to test code that publishes
// asynchronously — an outbox relay, a pool, a publishing wrapper — on
// confirm, on failure and while a message is unconfirmed, without a
// broker. Nothing is delivered anywhere. Its methods may be called
// concurrently, Resolve from any goroutine.
type AsyncPublisher struct {
	mu        sync.Mutex
	atOnce    func(m *sdk.Message) error
	pending   []*sdk.PublishResult // in publish order
	handed    map[string]*sdk.Message
	syncCalls int
}

var _ sdk.AsyncPublisher = (*AsyncPublisher)(nil)

// NewAsyncPublisher returns an AsyncPublisher with nothing published.
func NewAsyncPublisher() *AsyncPublisher {
	return &AsyncPublisher{handed: map[string]*sdk.Message{}}
}

// ResolveAtOnce makes every later PublishAsync resolve its result before it
// returns, with fn's answer for the message (nil: confirmed); nil goes back
// to results the test resolves.
func (p *AsyncPublisher) ResolveAtOnce(fn func(m *sdk.Message) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.atOnce = fn
}

// Publish validates msgs as a broker does ([sdk.PrepareAll]), records a
// copy of each and counts the call ([AsyncPublisher.SyncCalls]): code
// that should publish asynchronously can check it never came here. With
// ctx already done it records nothing and returns ctx.Err(), as a broker
// does.
func (p *AsyncPublisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, 0); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncCalls++
	for _, m := range msgs {
		p.handed[m.ID] = m.Clone()
	}
	return nil
}

// PublishAsync validates msg as a broker does ([sdk.Prepare]), records a
// copy of it as it was handed over and returns its pending result. With
// ctx already done it records nothing and returns ctx.Err(), as
// [sdk.AsyncPublisher] requires.
func (p *AsyncPublisher) PublishAsync(ctx context.Context, queue string, msg *sdk.Message) (*sdk.PublishResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := sdk.Prepare(ctx, queue, msg, 0); err != nil {
		return nil, err
	}
	r := sdk.NewPublishResult(msg.ID)
	p.mu.Lock()
	p.handed[msg.ID] = msg.Clone()
	atOnce := p.atOnce
	if atOnce == nil {
		p.pending = append(p.pending, r)
	}
	p.mu.Unlock()
	if atOnce != nil {
		r.Resolve(atOnce(msg))
	}
	return r, nil
}

// Resolve resolves the oldest pending result of the message with id with
// err (nil: the broker confirmed it), running what waits on it on the
// calling goroutine as a broker's confirming goroutine would. It reports
// false when no result of that message is pending.
func (p *AsyncPublisher) Resolve(id string, err error) bool {
	p.mu.Lock()
	var r *sdk.PublishResult
	for i, q := range p.pending {
		if q.ID() == id {
			r = q
			p.pending = append(p.pending[:i], p.pending[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	return r != nil && r.Resolve(err)
}

// Pending returns the IDs of the messages whose results are not resolved,
// in publish order.
func (p *AsyncPublisher) Pending() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, len(p.pending))
	for i, r := range p.pending {
		ids[i] = r.ID()
	}
	return ids
}

// Message returns a copy of the last message published with id as it was
// handed over (headers included), nil when none was.
func (p *AsyncPublisher) Message(id string) *sdk.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.handed[id]; m != nil {
		return m.Clone()
	}
	return nil
}

// SyncCalls returns how many Publish calls were made.
func (p *AsyncPublisher) SyncCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.syncCalls
}
