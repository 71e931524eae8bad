package brokertest

// cases is the conformance suite, in the order Run runs it.
var cases = []testCase{}
