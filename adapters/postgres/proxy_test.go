package postgres_test

import (
	"net"
	"testing"

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
