package brokerurl

import (
	"fmt"
	"net/url"
)

// urlParts says which parts of a URL, besides its scheme and query, a
// scheme's opener uses.
type urlParts uint8

const (
	usesUser urlParts = 1 << iota // user[:password]@
	usesHost                      // host[:port]
	usesPath                      // /path (beyond a lone "/")
)

// unusedParts refuses, with an error wrapping [ErrInvalidURL], a part of u
// that the opener of scheme does not use: a user who wrote the queue into
// an sqs:// path, or a database into a mem:// host, believes it is used.
// No built-in scheme uses a fragment. A lone "/" path names nothing and is
// allowed everywhere ("sqs://eu-west-1/"). The error never quotes the user
// info; it quotes the host or the path (which hold no password).
func unusedParts(scheme string, u *url.URL, uses urlParts) error {
	switch {
	case u.Fragment != "":
		return fmt.Errorf("%w: %s: the URL has a fragment (#…), which %s:// does not use", ErrInvalidURL, scheme, scheme)
	case uses&usesUser == 0 && u.User != nil:
		return fmt.Errorf("%w: %s: the URL has user info (user[:password]@), which %s:// does not use", ErrInvalidURL, scheme, scheme)
	case uses&usesHost == 0 && u.Host != "":
		return fmt.Errorf("%w: %s: the URL has a host (%q), which %s:// does not use", ErrInvalidURL, scheme, u.Host, scheme)
	case uses&usesPath == 0 && u.Path != "" && u.Path != "/":
		return fmt.Errorf("%w: %s: the URL has a path (%q), which %s:// does not use (queues are named where they are used, not in the broker URL)",
			ErrInvalidURL, scheme, u.Path, scheme)
	}
	return nil
}
