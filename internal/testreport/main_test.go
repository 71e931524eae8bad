package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0}
{"Action":"run","Package":"p","Test":"TestB/sub"}
{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    x_test.go:9: unsupported: no lease on RabbitMQ\n"}
{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    --- SKIP: TestB/sub (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestB/sub","Elapsed":0}
{"Action":"pass","Package":"p","Test":"TestB","Elapsed":0}
{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:3: boom\n"}
{"Action":"fail","Package":"p","Test":"TestC","Elapsed":0}
{"Action":"fail","Package":"p","Elapsed":0.5}
`

func TestReport(t *testing.T) {
	var out bytes.Buffer
	if code := report(strings.NewReader(sample), &out); code != 1 {
		t.Errorf("exit %d with a failed test, want 1", code)
	}
	s := out.String()
	for _, want := range []string{
		"FAIL\tp\t0.500s",
		"--- FAIL: p TestC\n    c_test.go:3: boom",
		"p TestB/sub: x_test.go:9: unsupported: no lease on RabbitMQ",
		"tests: 2 passed, 1 failed, 1 skipped",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestSkipForMissingServiceFails(t *testing.T) {
	in := `{"Action":"output","Package":"p","Test":"TestI","Output":"    i.go:1: integration: RabbitMQ: does not answer\n"}
{"Action":"skip","Package":"p","Test":"TestI","Elapsed":0}
{"Action":"pass","Package":"p","Elapsed":0.1}
`
	var out bytes.Buffer
	if code := report(strings.NewReader(in), &out); code != 1 {
		t.Fatalf("exit %d for a skipped integration test, want 1:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "ok  \tp\t0.100s") {
		t.Errorf("package line missing:\n%s", out.String())
	}
}

func TestAllGreen(t *testing.T) {
	in := `{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0}
{"Action":"pass","Package":"p","Elapsed":0.1}
`
	var out bytes.Buffer
	if code := report(strings.NewReader(in), &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "tests: 1 passed, 0 failed, 0 skipped") {
		t.Errorf("closing line:\n%s", out.String())
	}
}
