package rabbitmq

import (
	"testing"
	"time"
)

// AMQP negotiates the heartbeat in whole seconds, and amqp091 sends 0 ("use
// the server's", 60 s by default) for anything shorter: a sub-second
// Heartbeat (say heartbeat=500ms in a broker URL) is refused rather than
// silently becoming six times the default.
func TestSubSecondHeartbeatRefused(t *testing.T) {
	for h, ok := range map[time.Duration]bool{500 * time.Millisecond: false, time.Nanosecond: false, 0: true, time.Second: true, 1500 * time.Millisecond: true} {
		_, err := Options{Heartbeat: h}.withDefaults()
		if ok != (err == nil) {
			t.Errorf("Heartbeat %s: %v", h, err)
		}
	}
}
