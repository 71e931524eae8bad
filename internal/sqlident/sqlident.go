// Package sqlident validates and quotes the SQL identifiers (table and column
// names) that berth's packages splice into statements. Values always
// travel as bind parameters; only identifiers are spliced, and only after this
// package accepted and quoted them.
package sqlident

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/sdk"
)

// ErrInvalid reports a table or column name that is not a plain identifier.
var ErrInvalid = errors.New("invalid SQL identifier")

// nameRE is a conservative identifier: letters, digits and '_', not starting
// with a digit, at most 63 bytes (PostgreSQL's NAMEDATALEN-1).
var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Column validates a column name and returns it quoted.
func Column(name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("%w: column %q", ErrInvalid, name)
	}
	return pgx.Identifier{name}.Sanitize(), nil
}

// Table validates a table name, optionally schema-qualified ("billing.orders"),
// and returns it quoted.
func Table(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: table %q", ErrInvalid, name)
	}
	for _, p := range parts {
		if !nameRE.MatchString(p) {
			return "", fmt.Errorf("%w: table %q", ErrInvalid, name)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// Columns validates and quotes each name; duplicates are refused.
func Columns(names []string) ([]string, error) {
	out := make([]string, len(names))
	seen := make(map[string]bool, len(names))
	for i, n := range names {
		q, err := Column(n)
		if err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, fmt.Errorf("%w: column %q given twice", ErrInvalid, n)
		}
		seen[n] = true
		out[i] = q
	}
	return out, nil
}

// Keyed validates and quotes a table, its key column (default "id") and one
// more column (default def), which must differ from the key: the shape of
// every versioned or fenced row update.
func Keyed(table, key, col, def string) (qTable, qKey, qCol string, err error) {
	if key == "" {
		key = "id"
	}
	if col == "" {
		col = def
	}
	if key == col {
		return "", "", "", fmt.Errorf("%w: key column and %s column are both %q", ErrInvalid, def, key)
	}
	if qTable, err = Table(table); err != nil {
		return "", "", "", err
	}
	if qKey, err = Column(key); err != nil {
		return "", "", "", err
	}
	if qCol, err = Column(col); err != nil {
		return "", "", "", err
	}
	return qTable, qKey, qCol, nil
}

// StorableText reports whether PostgreSQL's text type can hold s: valid
// UTF-8 without NUL bytes. A statement with a value that is not fails
// (SQLSTATE 22021), so no row holds one: a lookup by such a value finds
// nothing, and a name made of one is the caller's error.
func StorableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// UnstorableKey reports whether key is a string that PostgreSQL refuses as
// a parameter (see [StorableText]): no row has it, so a lookup by it is a
// missing row, decided without sending the statement (which would fail with
// SQLSTATE 22021 and abort the caller's transaction). A string is also a
// value of a named string type (type OrderID string) or a pointer to one,
// which pgx sends as its text.
func UnstorableKey(key any) bool {
	s, ok := stringKey(key)
	return ok && !StorableText(s)
}

// stringKey returns the text pgx sends for key when key is a string, a value
// of a named string type, or a non-nil pointer to one of these, and encodes
// itself in no other way (a driver.Valuer or pgtype.TextValuer may).
func stringKey(key any) (string, bool) {
	if s, ok := key.(string); ok {
		return s, true
	}
	v := reflect.ValueOf(key)
	for {
		if !v.IsValid() {
			return "", false
		}
		switch v.Interface().(type) {
		case driver.Valuer, pgtype.TextValuer:
			return "", false
		}
		if v.Kind() != reflect.Pointer {
			break
		}
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.String {
		return "", false
	}
	return v.String(), true
}

// KeyText is key as error text: a string (a row key often comes from a
// message, so it is untrusted; see stringKey for what counts as one) quoted
// with Go escapes, so that a NUL, a newline or a terminal escape in it
// cannot forge or garble a log line or a terminal; any other key as fmt
// prints it, quoted the same way (see [Text]) when that text needs escapes
// (a pgtype.Text or sql.NullString holding a message's text).
func KeyText(key any) string {
	if k, ok := key.([]byte); ok {
		return strconv.Quote(string(k))
	}
	if s, ok := stringKey(key); ok {
		return strconv.Quote(s)
	}
	return Text(fmt.Sprint(key))
}

// Text is s as error text: s itself when Go would print it unescaped, else s
// quoted with Go escapes (a newline, a control or bidirectional-text
// character, invalid UTF-8): for text read from a row or from a message.
func Text(s string) string { return sdk.ErrorText(s) }

// EscapedErr returns err, a database error, with every character of its
// text that Go would not print unescaped (a newline, a control or
// bidirectional-text character, invalid UTF-8) written as its Go escape,
// and a backslash as \\: PostgreSQL repeats a value it cannot read in its
// message as it was sent (`invalid input syntax for type bigint:
// "1<newline>…"`), and keys and values come from messages. errors.Is and
// errors.As see err (the *pgconn.PgError and its SQLSTATE).
func EscapedErr(err error) error {
	if err == nil {
		return nil
	}
	return escapedError{err}
}

type escapedError struct{ err error }

func (e escapedError) Error() string { return escape(e.err.Error()) }
func (e escapedError) Unwrap() error { return e.err }

// escape writes s with each character strconv.Quote would escape escaped,
// without the quotes (a PostgreSQL message quotes values itself).
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// DataException reports whether err is PostgreSQL refusing a statement's
// values themselves: a data exception (SQLSTATE class 22), such as a key
// the key column's type cannot read ("abc" for a bigint or a uuid, a number
// beyond its range) or a value to set of the wrong form. The same values
// fail the same way on every retry.
func DataException(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22")
}
