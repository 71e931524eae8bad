package telemetry

import (
	"slices"
	"testing"

	"github.com/berthq/berth/internal/otelfloor"
)

// The metrics floor the benchmarks measure berth against records into
// histograms of the same boundaries as berth's: a floor with fewer buckets
// would cost less per Record and overstate berth's own cost, one with more
// would hide it.
func TestFloorBucketsMatch(t *testing.T) {
	if !slices.Equal(durationBuckets, otelfloor.DurationBuckets) {
		t.Fatalf("otelfloor.DurationBuckets = %v, telemetry's duration buckets = %v", otelfloor.DurationBuckets, durationBuckets)
	}
}
