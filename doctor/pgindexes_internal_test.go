package doctor

import (
	"testing"

	"github.com/berthq/berth/brokers/postgres"
)

// TestIndexCostsListed: every index schema.sql creates has its cost and
// severity, and no other index has one (a renamed index would be checked
// as a Warn, with a cost that names nothing).
func TestIndexCostsListed(t *testing.T) {
	ixs := postgres.Indexes()
	seen := map[string]bool{}
	for _, ix := range ixs {
		if _, ok := indexCosts[ix.Name]; !ok {
			t.Errorf("schema.sql creates %s; indexCosts has no entry for it", ix.Name)
		}
		seen[ix.Name] = true
	}
	for name := range indexCosts {
		if !seen[name] {
			t.Errorf("indexCosts has %s, which schema.sql does not create (%v)", name, ixs)
		}
	}
}
