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

// cutBody cuts a body between characters, by up to utf8.UTFMax bytes, and
// leaves a body that is short enough, or a limit below 0, whole.
func TestCutBody(t *testing.T) {
	for _, c := range []struct {
		b     string
		limit int
		want  string
		cut   bool
	}{
		{"abc", 3, "abc", false},
		{"abc", -1, "abc", false},
		{"abcd", 3, "abc", true},
		{"a€b", 2, "a", true},                 // inside "€" (3 bytes)
		{"a€b", 3, "a", true},                 // inside "€"
		{"a€b", 4, "a€", true},                // after it
		{"a😀b", 4, "a", true},                 // inside a 4-byte character
		{"😀😀", 2, "", true},                   // no character starts before the cut
		{"\xff\xfe\xfd", 2, "\xff\xfe", true}, // not UTF-8: cut where asked
	} {
		got, cut := cutBody([]byte(c.b), c.limit)
		if string(got) != c.want || cut != c.cut {
			t.Errorf("cutBody(%q, %d) = %q, %v, want %q, %v", c.b, c.limit, got, cut, c.want, c.cut)
		}
	}
}
