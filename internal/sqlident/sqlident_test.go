package sqlident_test

import (
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/sqlident"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTable(t *testing.T) {
	good := map[string]string{
		"orders":         `"orders"`,
		"Billing.Orders": `"Billing"."Orders"`,
		"_t1":            `"_t1"`,
	}
	for in, want := range good {
		if got, err := sqlident.Table(in); err != nil || got != want {
			t.Errorf("Table(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1orders", "a.b.c", ".orders", "orders.", `or"ders`, "orders; DROP TABLE x", "ö", string(make([]byte, 64))} {
		if _, err := sqlident.Table(in); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("Table(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestColumns(t *testing.T) {
	if got, err := sqlident.Columns([]string{"a", "b_2"}); err != nil || len(got) != 2 || got[1] != `"b_2"` {
		t.Errorf("Columns = %q, %v", got, err)
	}
	for _, in := range [][]string{{"a", "a"}, {"a.b"}, {"a b"}, {""}} {
		if _, err := sqlident.Columns(in); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("Columns(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestKeyed(t *testing.T) {
	tb, k, c, err := sqlident.Keyed("billing.orders", "", "", "version")
	if err != nil || tb != `"billing"."orders"` || k != `"id"` || c != `"version"` {
		t.Fatalf("Keyed defaults = %s %s %s, %v", tb, k, c, err)
	}
	for _, bad := range [][3]string{{"orders", "version", "version"}, {"orders; drop", "", ""}, {"orders", "id; --", ""}, {"orders", "", "a b"}} {
		if _, _, _, err := sqlident.Keyed(bad[0], bad[1], bad[2], "version"); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("Keyed%q = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestStorableText(t *testing.T) {
	for s, want := range map[string]bool{"": true, "billing": true, "é": true, "a\x00b": false, "a\xffb": false} {
		if got := sqlident.StorableText(s); got != want {
			t.Errorf("StorableText(%q) = %v, want %v", s, got, want)
		}
	}
}

type namedKey string

// hexKey encodes itself (as hex), so its raw text is not what is sent.
type hexKey string

func (k hexKey) Value() (driver.Value, error) { return strings.ToUpper(string(k)), nil }

func TestUnstorableKey(t *testing.T) {
	bad, good := namedKey("a\x00"), namedKey("a")
	var nilKey *namedKey
	for _, c := range []struct {
		key  any
		want bool
	}{
		{"a\x00", true}, {"a\xff", true}, {"a", false}, {bad, true}, {&bad, true}, {good, false}, {&good, false},
		{nilKey, false}, {nil, false}, {42, false}, {[]byte("a\x00"), false}, {hexKey("a\x00"), false},
	} {
		if got := sqlident.UnstorableKey(c.key); got != c.want {
			t.Errorf("UnstorableKey(%#v) = %v, want %v", c.key, got, c.want)
		}
	}
	if got, want := sqlident.KeyText(&bad), `"a\x00"`; got != want {
		t.Errorf("KeyText(&namedKey) = %s, want %s", got, want)
	}
}

// EscapedErr escapes what PostgreSQL repeats of a value in its message and
// keeps the error's chain; Text quotes only text that needs escapes.
func TestEscapedErrAndText(t *testing.T) {
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: "invalid input syntax for type bigint: \"1\n\x1b[31m\u202e\\\xff\""}
	err := sqlident.EscapedErr(pe)
	if got, want := err.Error(), `ERROR: invalid input syntax for type bigint: "1\n\x1b[31m\u202e\\\xff" (SQLSTATE 22P02)`; got != want {
		t.Errorf("EscapedErr text = %s, want %s", got, want)
	}
	var as *pgconn.PgError
	if !errors.As(err, &as) || as != pe || !sqlident.DataException(err) {
		t.Errorf("EscapedErr lost the *pgconn.PgError from its chain")
	}
	if sqlident.EscapedErr(nil) != nil {
		t.Error("EscapedErr(nil) != nil")
	}
	for in, want := range map[string]string{"pending": "pending", "": "", "a\nb": `"a\nb"`, "\u202e": `"\u202e"`, `say "x"`: `"say \"x\""`} {
		if got := sqlident.Text(in); got != want {
			t.Errorf("Text(%q) = %s, want %s", in, got, want)
		}
	}
}
