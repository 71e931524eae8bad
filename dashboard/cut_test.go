package dashboard

import "testing"

// The dashboard's short cuts a cell between whole escapes: before, it
// escaped and then cut by rune, leaving half an escape (\u20, or a lone \
// that read as the start of an escape of what followed).
func TestShortCutsBetweenEscapes(t *testing.T) {
	short := funcs["short"].(func(string, int) string)
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"abcd\u200befgh", 6, "abcd…"},
		{"abcd\u200befgh", 8, "abcd…"},
		{"abcd\u200befgh", 11, "abcd\\u200b…"},
		{`abcd\x`, 6, "abcd…"},
		{`abcd\x`, 7, `abcd\\x`},
		{"ab\u202eevil", 4, "ab…"},
	} {
		if got := short(c.s, c.n); got != c.want {
			t.Errorf("short(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
