package pgledger

import (
	"regexp"
	"slices"
	"testing"
)

// TestIndexesListed: MissingIndexes checks every index SQL creates, and no
// other: an index added to SQL and not to indexes would go unreported by
// the doctor on a table made before it.
func TestIndexesListed(t *testing.T) {
	ddl, err := SQL(Options{Prefix: "p_"})
	if err != nil {
		t.Fatal(err)
	}
	var created []string
	for _, m := range regexp.MustCompile(`CREATE INDEX IF NOT EXISTS "([a-z0-9_]+)"`).FindAllStringSubmatch(ddl, -1) {
		created = append(created, m[1])
	}
	var listed []string
	o, err := Options{Prefix: "p_"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range indexes(o) {
		listed = append(listed, ix.Name)
	}
	if len(created) == 0 || !slices.Equal(created, listed) {
		t.Errorf("SQL creates %v; MissingIndexes checks %v", created, listed)
	}
}
