//go:build linux

package filelocks

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// probeEnv names the file to probe in the re-executed test binary.
const probeEnv = "LOCKS_FILELOCKS_PROBE"

// The byte ranges SQLite's unix VFS locks (os_unix.c, sqliteInt.h): a
// connection that has a WAL database open keeps a read lock on the
// database file's SHARED range, and one on the -shm file's DMS byte, for
// as long as it is open; the last connection to close is the one that
// can take them exclusively, and only it deletes -wal and -shm.
const (
	sharedFirst = 0x40000002 // PENDING_BYTE+2
	sharedSize  = 510
	dmsByte     = 128 // WALINDEX_LOCK_OFFSET (120) + SQLITE_SHM_NLOCK (8)
)

// Locks is what another process sees held on a database.
type Locks struct {
	// DB and Shm are the pids holding a lock that conflicts with a write
	// lock on the database's SHARED range and on the -shm's DMS byte;
	// 0 when none does (or the file is missing).
	DB, Shm int
}

func init() {
	path := os.Getenv(probeEnv)
	if path == "" {
		return
	}
	l := Locks{DB: holder(path, sharedFirst, sharedSize), Shm: holder(path+"-shm", dmsByte, 1)}
	_ = json.NewEncoder(os.Stdout).Encode(l)
	os.Exit(0)
}

// holder returns the pid of a process holding a lock on n bytes of the
// file at path from off, 0 when none does.
func holder(path string, off, n int64) int {
	f, err := os.Open(path) // this probe's own process: no lock of the tested one is touched
	if err != nil {
		return 0
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: n}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if lk.Type == unix.F_UNLCK {
		return 0
	}
	return int(lk.Pid)
}

// Owners reports, from a new process, who holds SQLite's locks on the
// database at path.
func Owners(t testing.TB, path string) Locks {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), probeEnv+"="+path)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probing the locks on %s: %v", path, err)
	}
	var l Locks
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &l); err != nil {
		t.Fatalf("probing the locks on %s: %v in %q", path, err, out)
	}
	return l
}

// RequireHeld fails the test unless this process still holds SQLite's
// locks on the database at path and on its -shm file, as a WAL connection
// of this process that is still open does; what names the step after
// which they were checked.
func RequireHeld(t testing.TB, path, what string) {
	t.Helper()
	l := Owners(t, path)
	pid := os.Getpid()
	if l.DB != pid || l.Shm != pid {
		t.Fatalf("after %s, this process (pid %d) no longer holds the application connection's locks: "+
			"database file held by pid %d, -shm by pid %d (0: nobody); some code closed a descriptor of the file",
			what, pid, l.DB, l.Shm)
	}
}
