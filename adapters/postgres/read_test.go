package postgres_test

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// cutProxy forwards TCP to a server. Once armed with a marker, it cuts
// the first connection on which the client then sends bytes holding the
// marker (any bytes, for ""), before they reach the server: a connection
// lost under a read, deterministically.
type cutProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	marker []byte
	armed  bool
	cuts   int
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{}
	p.ln = newProxy(t, target, func(c, s net.Conn) {
		go func() { forward(c, s, nil); c.Close() }() // the server's answers
		forward(s, c, func(b []byte) bool { return !p.cut(b) })
		s.Close()
		c.Close()
	})
	return p
}

// cut reports whether the client's bytes b are the ones to cut.
func (p *cutProxy) cut(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.armed || !bytes.Contains(b, p.marker) {
		return false
	}
	p.armed = false
	p.cuts++
	return true
}

// arm cuts the next connection that carries marker.
func (p *cutProxy) arm(marker string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.armed = []byte(marker), true
}

// cutOnce reports whether exactly one connection was cut since the last
// call, and disarms the proxy.
func (p *cutProxy) cutOnce() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	once := p.cuts == 1 && !p.armed
	p.cuts, p.armed = 0, false
	return once
}

// through returns dsn with its host replaced by p's.
func (p *cutProxy) through(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = p.ln.Addr().String()
	return u.String()
}

// Every read of the store and of an inspection runs again when its
// connection is lost under it, after its statement was sent: a read
// changes nothing, and another connection answers. Each case cuts one
// connection, at the read's own statement, and the read must still
// answer, having been cut once.
func TestRead_RunsAgainWhenItsConnectionIsLost(t *testing.T) {
	ctx := context.Background()
	dsn := MigratedDSN(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	px := newCutProxy(t, u.Host)
	via := px.through(t, dsn)

	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "cut-under-a-read"}
	store, svc := heldBy(t, via, 1, "A", ref)
	ro, err := postgres.OpenReadOnly(ctx, via, postgres.Options{MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { ro.Close() })

	for _, c := range []struct {
		name, marker string // marker: "" cuts whatever the read sends first
		read         func() error
	}{
		{"Get", "", func() error {
			l, err := svc.Get(ctx, ref)
			if err == nil && l.Owner != "A" {
				t.Errorf("Get read the lock of %q", l.Owner)
			}
			return err
		}},
		{"List", "", func() error {
			ls, err := store.List(ctx, application.ListFilter{Owner: "A"})
			if err == nil && len(ls) != 1 {
				t.Errorf("List read %d locks", len(ls))
			}
			return err
		}},
		{"CountExpired", "", func() error { _, err := store.CountExpired(ctx, time.Now()); return err }},
		{"OpenReadOnly", "-- ping", func() error {
			db, err := postgres.OpenReadOnly(ctx, via, postgres.Options{})
			if err == nil {
				err = db.Close()
			}
			return err
		}},
		{"Schema", "", func() error {
			st, err := ro.Schema(ctx)
			if err == nil && !st.MigrationApplied {
				t.Error("Schema found the migration not applied")
			}
			return err
		}},
		{"InspectedList", "", func() error {
			_, err := postgres.NewLockRepository(ro).List(ctx, application.ListFilter{})
			return err
		}},
		{"CheckWritable", "pg_is_in_recovery", func() error { return postgres.CheckWritable(ctx, via) }},
		{"ServerClock", "clock_timestamp", func() error {
			c, err := postgres.NewServerClock(ctx, ro, postgres.SystemClock{})
			if err == nil {
				c.Close()
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			px.arm(c.marker)
			require.NoError(t, c.read(), "a read whose connection was lost under it failed")
			require.True(t, px.cutOnce(), "the proxy did not cut the read's connection once: the test proved nothing")
		})
	}
}

// The server's report that it ended a session (an operator's
// pg_terminate_backend) reads as a session that ended, on which a read
// runs again; a server that cannot be reached does not.
func TestSessionEnded(t *testing.T) {
	ctx := context.Background()
	dsn, app := testdb.WithApp(t, testdb.Postgres(t))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	admin := rawPG(t, testdb.Postgres(t))
	_, err = admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		return n == 0
	}, 10*time.Second, time.Millisecond)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.True(t, postgres.SessionEnded(err), "%v", err)

	_, err = pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	require.Error(t, err)
	require.False(t, postgres.SessionEnded(err), "%v", err)
}
