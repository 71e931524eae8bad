package main

import (
	"strings"
	"testing"
)

// The dashboard's title (every page's header and <title>) is the broker
// URL without its secrets. A user name without a password is one: NATS
// takes nats://TOKEN@host as a token (nats.go: a URL user without a
// password is the token), which every reader of the dashboard, read-only or
// not, saw.
func TestUITitleHidesAToken(t *testing.T) {
	for raw, want := range map[string]string{
		"nats://s3cretToken@127.0.0.1:4222":          "nats://127.0.0.1:4222",
		"nats://user:s3cretpw@127.0.0.1:4222":        "nats://user@127.0.0.1:4222",
		"amqp://guest:s3cretpw@127.0.0.1:5672/vhost": "amqp://guest@127.0.0.1:5672/vhost",
		"postgres://app@db/app?password=s3cretpw":    "postgres://app@db/app",
		"NATS://s3cretToken@127.0.0.1":               "nats://127.0.0.1",
		"mem://":                                     "mem://",
	} {
		got := redactedURL(raw)
		if strings.Contains(got, "s3cret") || got != want {
			t.Errorf("redactedURL(%q) = %q, want %q", raw, got, want)
		}
	}
}
