package integration_test

// berth's own end-to-end tests may run where no service listens on
// loopback: they start containers then.
import _ "github.com/berthq/berth/integration/containers"
