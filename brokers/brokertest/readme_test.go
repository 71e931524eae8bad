package brokertest

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The README counts the conformance suite's cases; it said 55 while cases
// held 56.
func TestREADMECountsTheCases(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("\\(`brokers/brokertest`, (\\d+)\\s+cases\\)").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md no longer counts the conformance cases as \"(`brokers/brokertest`, N cases)\"")
	}
	if n, _ := strconv.Atoi(string(m[1])); n != len(cases) {
		t.Errorf("README.md says %d conformance cases; the suite has %d", n, len(cases))
	}
}
