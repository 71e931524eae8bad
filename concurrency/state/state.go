// Package state guards a status column with a declared transition table, so
// that a status only ever moves forward, whatever order duplicated and
// retried jobs arrive in.
//
// A transition is one conditional UPDATE:
//
//	UPDATE orders SET status = $2 WHERE id = $1 AND status = ANY($3)
//
// where $3 is the set of states the table allows the target to be reached
// from. The database decides, atomically, so two workers racing on one row
// cannot both move it, and a worker holding stale data cannot move it back.
// Re-applying the state a row is already in succeeds without writing (a
// duplicate delivery is harmless); any other refused move is a permanent
// error (sdk.Permanent wrapping a [*TransitionError], [ErrInvalidTransition]).
package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/berthq/berth/internal/notfound"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrInvalidTransition reports a move the transition table does not allow
	// from the row's current state. It arrives wrapped in sdk.Permanent.
	ErrInvalidTransition = errors.New("state: transition not allowed")
	// ErrUnknownState reports a state the transition table does not declare.
	ErrUnknownState = errors.New("state: unknown state")
	// ErrNotFound reports that no row has the key (a string key
	// PostgreSQL cannot store — a NUL byte, invalid UTF-8 — is answered
	// so without a query, leaving a transaction usable). It matches
	// sdk.ErrNotFound too, and arrives wrapped in sdk.Permanent: a job about
	// a row that does not exist cannot succeed (the same convention in every
	// concurrency package; ARCHITECTURE.md, "Error classes").
	ErrNotFound = notfound.New("state: row not found")
	// ErrInvalidTable reports a transition table rejected by [New].
	ErrInvalidTable = errors.New("state: invalid transition table")
)

// TransitionError describes a refused move. It wraps [ErrInvalidTransition].
type TransitionError struct {
	Key any
	// From is the row's state, "" when its status column is NULL (or
	// empty); To is the refused target.
	From, To string
	// Backward is true when From can be reached from To: the move would
	// undo progress (paid → pending). When false the move skips ahead of a
	// step the table requires (pending → paid without processing) or leaves
	// a final state sideways.
	Backward bool
}

// Error describes the refused move.
func (e *TransitionError) Error() string {
	dir := "not allowed"
	if e.Backward {
		dir = "backward"
	}
	from := sqlident.Text(e.From) // read from the row: any text
	if from == "" {
		from = "(NULL or empty)"
	}
	return fmt.Sprintf("state: %s: %s → %s is %s", sqlident.KeyText(e.Key), from, e.To, dir)
}

// Unwrap returns ErrInvalidTransition.
func (e *TransitionError) Unwrap() error { return ErrInvalidTransition }

// DB is what the statements run on: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Options configure a [Machine].
type Options struct {
	// Table name, optionally schema-qualified. Required. Validated and quoted.
	Table string
	// KeyColumn identifies the row. Default "id".
	KeyColumn string
	// StatusColumn holds the state, a text column. Default "status".
	StatusColumn string
	// Transitions maps each state to the states it may move to, e.g.
	// {"pending": {"processing", "cancelled"}, "processing": {"paid"}}.
	// Every state appears as a key (final states with no targets), the
	// graph has no cycle, and no state lists itself: re-applying the
	// current state is always a no-op success and needs no entry.
	Transitions map[string][]string
}

// Machine applies transitions to rows of one table. It is safe for concurrent
// use.
type Machine struct {
	name      string
	key       string // quoted
	status    string // quoted
	selectSQL string
	updateSQL string
	from      map[string][]string        // target -> allowed sources
	reach     map[string]map[string]bool // state -> states reachable from it
}

// New validates the transition table (known states, no self-loop, no cycle)
// and the identifiers, and returns a Machine.
func New(opts Options) (*Machine, error) {
	table, err := sqlident.Table(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if opts.KeyColumn == "" {
		opts.KeyColumn = "id"
	}
	if opts.StatusColumn == "" {
		opts.StatusColumn = "status"
	}
	m := &Machine{name: opts.Table, from: make(map[string][]string), reach: make(map[string]map[string]bool)}
	if m.key, err = sqlident.Column(opts.KeyColumn); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if m.status, err = sqlident.Column(opts.StatusColumn); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if len(opts.Transitions) == 0 {
		return nil, fmt.Errorf("%w: no states", ErrInvalidTable)
	}
	for s, targets := range opts.Transitions {
		if s == "" {
			return nil, fmt.Errorf("%w: empty state name", ErrInvalidTable)
		}
		for _, t := range targets {
			if _, ok := opts.Transitions[t]; !ok {
				return nil, fmt.Errorf("%w: %s → %s: %w %q (list every state as a key)", ErrInvalidTable, s, t, ErrUnknownState, t)
			}
			if t == s {
				return nil, fmt.Errorf("%w: %s → %s: self-transitions are implicit no-ops", ErrInvalidTable, s, t)
			}
			if slices.Contains(m.from[t], s) {
				return nil, fmt.Errorf("%w: %s → %s listed twice", ErrInvalidTable, s, t)
			}
			m.from[t] = append(m.from[t], s)
		}
	}
	for t := range m.from {
		slices.Sort(m.from[t])
	}
	if cyc := findCycle(opts.Transitions); cyc != nil {
		return nil, fmt.Errorf("%w: cycle %s", ErrInvalidTable, strings.Join(cyc, " → "))
	}
	for s := range opts.Transitions {
		m.reach[s] = reachable(opts.Transitions, s)
	}
	m.selectSQL = "SELECT " + m.status + " FROM " + table + " WHERE " + m.key + " = $1"
	// The CTE locks the row and reads its state under that lock, so the
	// UPDATE can return the state it moved from; under READ COMMITTED a
	// concurrent mover is waited for and its result re-read.
	m.updateSQL = "WITH berth_prev AS (SELECT " + m.status + " FROM " + table + " WHERE " + m.key +
		" = $1 FOR UPDATE) UPDATE " + table + " AS berth_cur SET " + m.status + " = $2%s FROM berth_prev" +
		" WHERE berth_cur." + m.key + " = $1 AND berth_prev." + m.status + " = ANY($3) RETURNING berth_prev." + m.status
	return m, nil
}

// findCycle returns a cycle of the graph, or nil.
func findCycle(g map[string][]string) []string {
	const (
		white = iota
		grey
		black
	)
	color := make(map[string]int, len(g))
	var path []string
	var visit func(s string) []string
	visit = func(s string) []string {
		color[s] = grey
		path = append(path, s)
		for _, t := range g[s] {
			switch color[t] {
			case grey:
				i := slices.Index(path, t)
				return append(slices.Clone(path[i:]), t)
			case white:
				if c := visit(t); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		color[s] = black
		return nil
	}
	states := make([]string, 0, len(g))
	for s := range g {
		states = append(states, s)
	}
	slices.Sort(states) // deterministic error text
	for _, s := range states {
		if color[s] == white {
			if c := visit(s); c != nil {
				return c
			}
		}
	}
	return nil
}

func reachable(g map[string][]string, s string) map[string]bool {
	seen := map[string]bool{}
	stack := slices.Clone(g[s])
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !seen[t] {
			seen[t] = true
			stack = append(stack, g[t]...)
		}
	}
	return seen
}

// Allowed reports whether the table allows from → to directly.
func (m *Machine) Allowed(from, to string) bool { return slices.Contains(m.from[to], from) }

// Result says what a transition did.
type Result struct {
	// From is the state the row was in: the previous state when Changed, the
	// target itself for a no-op.
	From string
	// Changed is false when the row was already in the target state.
	Changed bool
}

// maxRaces bounds how often Transition re-runs its UPDATE after the row
// moved between the UPDATE and the read that explains its failure.
const maxRaces = 3

// Transition moves the row whose key is key to state to, provided its current
// state is one the table allows to move there; set optionally names more
// columns to write in the same UPDATE (e.g. charged_at), validated and
// quoted, values as bind parameters.
//
// A row already in state to is left alone and reported with Changed false and
// a nil error. A refused move (from a state the table does not let move to
// to, one it does not declare, or a NULL status) returns sdk.Permanent
// wrapping a [*TransitionError] ([ErrInvalidTransition]); a missing row sdk.Permanent
// wrapping [ErrNotFound]; an undeclared target sdk.Permanent wrapping
// [ErrUnknownState]; a key or value PostgreSQL cannot read (a data
// exception, SQLSTATE class 22) sdk.Permanent wrapping its error. Run it in the transaction that makes the rest of the
// job's effect, so that the move and the effect commit together.
func (m *Machine) Transition(ctx context.Context, db DB, key any, to string, set map[string]any) (Result, error) {
	if _, ok := m.reach[to]; !ok {
		return Result{}, sdk.Permanent(fmt.Errorf("%w %q", ErrUnknownState, to))
	}
	q, args, err := m.update(key, to, set)
	if err != nil {
		return Result{}, err
	}
	if sqlident.UnstorableKey(key) {
		return Result{}, m.wrap(ctx, key, pgx.ErrNoRows) // no row holds it
	}
	for range maxRaces {
		var from string
		err := db.QueryRow(ctx, q, args...).Scan(&from)
		if err == nil {
			return Result{From: from, Changed: true}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Result{}, m.wrap(ctx, key, err)
		}
		// Refused: read the state to say why.
		var status *string
		if err := db.QueryRow(ctx, m.selectSQL, key).Scan(&status); err != nil {
			return Result{}, m.wrap(ctx, key, err)
		}
		if status == nil {
			// A NULL status is no declared state: no move can start
			// from it, and a retry cannot change that.
			return Result{}, sdk.Permanent(&TransitionError{Key: key, To: to})
		}
		cur := *status
		switch {
		case cur == to:
			return Result{From: to}, nil
		case m.Allowed(cur, to):
			continue // the row moved into an allowed state meanwhile: try again
		default:
			return Result{}, sdk.Permanent(&TransitionError{Key: key, From: cur, To: to, Backward: m.reach[to][cur]})
		}
	}
	return Result{}, fmt.Errorf("state: %s %s: row kept moving during %d tries", m.name, sqlident.KeyText(key), maxRaces)
}

func (m *Machine) update(key any, to string, set map[string]any) (string, []any, error) {
	args := []any{key, to, m.from[to]}
	if args[2] == nil {
		args[2] = []string{} // no state leads here: only the no-op can succeed
	}
	var extra strings.Builder
	if len(set) > 0 {
		names := make([]string, 0, len(set))
		for c := range set {
			names = append(names, c)
		}
		slices.Sort(names)
		for _, c := range names {
			q, err := sqlident.Column(c)
			if err != nil {
				return "", nil, fmt.Errorf("state: %w", err)
			}
			if q == m.status || q == m.key {
				return "", nil, fmt.Errorf("state: set names the key or status column %q", c)
			}
			args = append(args, set[c])
			extra.WriteString(", " + q + " = $" + strconv.Itoa(len(args)))
		}
	}
	q := fmt.Sprintf(m.updateSQL, extra.String())
	return q, args, nil
}

func (m *Machine) wrap(ctx context.Context, key any, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("%w: %s %s", ErrNotFound, m.name, sqlident.KeyText(key)))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if sqlident.DataException(err) { // a retry sends the same values
		return sdk.Permanent(fmt.Errorf("state: %s %s: %w", m.name, sqlident.KeyText(key), sqlident.EscapedErr(err)))
	}
	return fmt.Errorf("state: %s %s: %w", m.name, sqlident.KeyText(key), sqlident.EscapedErr(err))
}
