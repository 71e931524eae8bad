package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/berthq/berth/sdk"
)

// authLogEvery is how often at most authLog writes a line.
const authLogEvery = time.Second

// authLog logs the requests refused for a wrong token (requireToken): the
// remote address, method and path, never the token tried. A flood (someone
// guessing tokens) must not fill the log: the first refusal is logged at
// once; those that follow within every are counted, and one line at the
// end of that interval gives their count and the latest of them; a refusal
// after a quiet interval is logged at once again. So at most one line
// every every.
type authLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time
	// after runs f after d (time.AfterFunc); a test replaces it.
	after func(d time.Duration, f func())

	mu      sync.Mutex
	logged  time.Time   // when the last line was written; zero: never
	pending bool        // a line of the refusals counted is due (after)
	muted   int         // refusals since the last line, not logged
	latest  []slog.Attr // the latest of them
}

func newAuthLog(l *slog.Logger) *authLog {
	return &authLog{log: l, every: authLogEvery, now: time.Now,
		after: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
}

// refused records r, refused for a wrong token.
func (l *authLog) refused(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.pending || (!l.logged.IsZero() && now.Sub(l.logged) < l.every) {
		l.muted++
		l.latest = refusedAttrs(r)
		if !l.pending {
			l.pending = true
			l.after(l.every-now.Sub(l.logged), l.flush)
		}
		return
	}
	l.logged = now
	l.log.LogAttrs(context.Background(), slog.LevelWarn, "dashboard: request refused: wrong token", refusedAttrs(r)...)
}

// flush writes the line of the refusals counted since the last one.
func (l *authLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = false
	if l.muted == 0 {
		return
	}
	l.logged = l.now()
	l.log.LogAttrs(context.Background(), slog.LevelWarn, "dashboard: requests refused: wrong token",
		slog.Int("count", l.muted), slog.Duration("within", l.every), slog.Attr{Key: "latest", Value: slog.GroupValue(l.latest...)})
	l.muted, l.latest = 0, nil
}

// refusedAttrs say which request r was refused: never its Authorization
// header (the token it tried). The path is the client's text: made valid
// UTF-8 and bounded (sdk.LogText); the handler quotes it.
func refusedAttrs(r *http.Request) []slog.Attr {
	return []slog.Attr{slog.String("remote", r.RemoteAddr), slog.String("method", r.Method), sdk.LogText("path", r.URL.Path)}
}
