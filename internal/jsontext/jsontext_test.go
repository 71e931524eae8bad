package jsontext_test

import (
	"encoding/json"
	"testing"

	"go.uber.org/goleak"

	"github.com/berthq/berth/internal/jsontext"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPlainIsWhatMarshalLeavesAlone: for every byte, and for strings of
// several, Plain holds exactly when json.Marshal writes the string as it
// is between quotes and it is printable ASCII.
func TestPlainIsWhatMarshalLeavesAlone(t *testing.T) {
	check := func(s string) {
		t.Helper()
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		printable := true
		for _, c := range []byte(s) {
			if c < 0x20 || c > 0x7e {
				printable = false
			}
		}
		want := printable && string(raw) == `"`+s+`"`
		if got := jsontext.Plain(s); got != want {
			t.Fatalf("Plain(%q) = %v, want %v (json.Marshal writes %s)", s, got, want, raw)
		}
	}
	for b := range 256 {
		check(string([]byte{byte(b)}))
		check("ab" + string([]byte{byte(b)}) + "cd")
	}
	for _, s := range []string{"", "0193a4bc-def0-7abc-9fed-cba987654321", "order.created", "a b", "é", "\u2028", "😀"} {
		check(s)
	}
}
