package telemetry

// LabelSets returns how many base label sets o caches (one per system,
// queue and job type label), for the cardinality test.
func LabelSets(o *Observer) int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return len(o.labels)
}
