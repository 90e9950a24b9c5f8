package cli

import (
	"encoding/binary"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// silentServer listens on a local port and accepts every connection; each
// is handed to serve, and closed when the test ends. It returns a
// PostgreSQL URL of it.
func silentServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	return "postgres://postgres@" + listen(t, serve) + "/test?sslmode=disable"
}

// listen accepts every connection on a local port and hands each to serve;
// it returns the port's address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
			go serve(conn)
		}
	}()
	return ln.Addr().String()
}

// readsForever reads what the client sends and never replies.
func readsForever(conn net.Conn) { _, _ = io.Copy(io.Discard, conn) }

// startupThenSilence proxies a connection to the real server at addr until
// the server is ready for the first query (its first ReadyForQuery), then
// forwards nothing more either way: a server that answers the startup and
// goes silent.
func startupThenSilence(addr string) func(net.Conn) {
	return func(client net.Conn) {
		server, err := net.Dial("tcp", addr)
		if err != nil {
			client.Close()
			return
		}
		ready := make(chan struct{})
		go func() { // client to server, until ready
			buf := make([]byte, 4096)
			for {
				n, err := client.Read(buf)
				if err != nil {
					server.Close()
					return
				}
				select {
				case <-ready:
				default:
					_, _ = server.Write(buf[:n])
				}
			}
		}()
		defer server.Close()
		for { // server to client, one message at a time, up to ReadyForQuery
			var head [5]byte
			if _, err := io.ReadFull(server, head[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
			if _, err := io.ReadFull(server, body); err != nil {
				return
			}
			if _, err := client.Write(append(head[:], body...)); err != nil {
				return
			}
			if head[0] == 'Z' {
				close(ready)
				_, _ = io.Copy(io.Discard, server)
				return
			}
		}
	}
}

// TestCLI_Deadline runs every command against a server that accepts the
// connection and never answers, and against one that answers the startup
// and then goes silent: each exits 1 within its deadline (plus a margin
// for starting the process), with an error that names the server and says
// what to check.
func TestCLI_Deadline(t *testing.T) {
	t.Parallel()
	const deadline = 2 * time.Second
	servers := map[string]string{"ReadsForever": silentServer(t, readsForever)}
	if dsn := os.Getenv("LOCKS_TEST_POSTGRES_DSN"); dsn != "" {
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		servers["StartupThenSilence"] = silentServer(t, startupThenSilence(u.Host))
	}
	commands := maps.Clone(everyCommand)
	// The wait is not bounded, but opening the store before it is.
	commands["acquire-wait"] = []string{"--owner", "op", "locks", "acquire", "--wait", "plan", "p1"}
	for server, db := range servers {
		for name, args := range commands {
			t.Run(server+"/"+name, func(t *testing.T) {
				t.Parallel()
				a := newAgents(t)
				start := time.Now()
				r := a.runEnv([]string{"AGENTS_TIMEOUT=2s"}, append([]string{"--db", db, "--json"}, args...)...)
				took := time.Since(start)
				assert.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
				assert.Less(t, took, deadline+5*time.Second, "the deadline is %s", deadline)
				assert.Contains(t, r.stderr, "no answer within 2s")
				assert.Contains(t, r.stderr, "check that the server is up")
				// The deadline ended the command: the advice is about the
				// deadline, never the adapter's for a refused connection
				// (a wrong host, user or password), which it is not.
				assert.NotContains(t, r.stderr+r.stdout, "user and password")
				if name != "diagnostics" {
					var doc map[string]map[string]any
					r.decode(t, &doc)
					assert.Equal(t, "internal", doc["error"]["code"])
				}
			})
		}
	}
}
