package postgres_test

import (
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// newProxy listens on a port of its own and, for each connection it
// accepts, dials target and runs serve on the two; it stops at the end of
// the test.
func newProxy(t *testing.T, target string, serve func(client, server net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go serve(c, s)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln
}

// forward copies what src sends to dst until either fails. each, when not
// nil, sees every chunk first; it may hold it, or drop the connection by
// returning false.
func forward(dst, src net.Conn, each func([]byte) bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if each != nil && !each(buf[:n]) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// newLaggyProxy forwards TCP to target, holding every chunk for delay in
// each direction: a link with a round trip of twice delay, the same both
// ways. It returns dsn with its host replaced by the proxy's.
func newLaggyProxy(t *testing.T, dsn string, delay time.Duration) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	hold := func([]byte) bool { time.Sleep(delay); return true }
	ln := newProxy(t, u.Host, func(c, s net.Conn) {
		go func() { forward(c, s, hold); c.Close() }() // the server's answers
		forward(s, c, hold)
		s.Close()
	})
	u.Host = ln.Addr().String()
	return u.String()
}
