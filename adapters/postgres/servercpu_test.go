package postgres_test

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serverCPU names the sessions of dsn app and returns the new DSN, with a
// function that reports how much CPU time the server's processes for those
// sessions have used so far: user and system time of each backend, from
// /proc. Wall time on a shared machine varies by tens of percent from run
// to run; the server's CPU time per cycle varies by a few, and shows what a
// statement costs the server. The function is nil when the backends cannot
// be read (a server on another machine, or not Linux).
func serverCPU(tb testing.TB, dsn, app string) (string, func() time.Duration) {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { admin.Close() })
	admin.SetMaxOpenConns(1)
	read := func() (time.Duration, bool) {
		rows, err := admin.Query(`SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			tb.Fatal(err)
		}
		defer rows.Close()
		var total time.Duration
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				tb.Fatal(err)
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return 0, false
			}
			// Fields after the command, which may hold spaces: state is
			// the first, utime the 12th, stime the 13th, in clock ticks
			// (USER_HZ, 100 on Linux).
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
			utime, _ := strconv.ParseInt(f[11], 10, 64)
			stime, _ := strconv.ParseInt(f[12], 10, 64)
			total += time.Duration(utime+stime) * 10 * time.Millisecond
		}
		return total, rows.Err() == nil
	}
	if _, ok := read(); !ok {
		return u.String(), nil
	}
	return u.String(), func() time.Duration { d, _ := read(); return d }
}
