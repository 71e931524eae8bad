package telemetry_test

import "testing"

// TestOneTracePerJob runs the publish → consume → retry → dead-letter trace
// scenario on every broker.
func TestOneTracePerJob(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		traceScenario(t, newMemory(t), uniqueQueue(t, "tt"))
	})
}
