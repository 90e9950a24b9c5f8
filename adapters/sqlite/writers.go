package sqlite

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"time"
)

// errWritersBusy reports that another process kept the store's writer
// lock for longer than the busy timeout.
var errWritersBusy = errors.New("another process kept the lock store's writer lock for longer than the busy timeout")

// writerQueue queues the write transactions of every process that opens
// one database file, with a kernel file lock (flock) on a side file,
// "<database>-lock", held from before BEGIN to after COMMIT.
//
// SQLite alone queues writers with its busy handler, which sleeps in
// steps of up to 100 ms, so a waiting process keeps missing its turn; the
// kernel wakes a flock waiter the moment the holder lets go. SQLite's own
// lock still decides who writes, so a process that does not take the file
// lock (the sqlite3 shell) still writes safely, just without the queue.
//
// flock cannot time out, so a call that gives up leaves the flock call
// running; the next lock call takes it over, or, if none comes, the lock
// is let go as soon as it is granted.
type writerQueue struct {
	f       *os.File // nil where file locks are not available
	timeout time.Duration

	mu        sync.Mutex
	granted   chan error // outcome of the flock call in flight, or nil
	abandoned bool       // whoever waited for that call gave up
	closed    bool       // the file is closed: its descriptor may be reused

	// waited: the last turn had to wait for another process. Only the
	// leader of a batch uses it, one at a time.
	waited bool
}

// politeDelay is how long a process whose last turn had to wait holds
// back before asking for the next: the process the kernel woke still has
// to be scheduled, while this one would ask again within microseconds and
// win the lock over and over. Without contention it costs nothing. The
// pause is a nanosleep of the thread (holdBack): time.Sleep wakes about a
// millisecond late here, which gave fairness and p99 worse than 200 µs.
const politeDelay = 200 * time.Microsecond

// openWriterQueue opens the side file of the database at path, read-only
// (all flock needs), creating it with the database's permissions so that
// every user who may write the database may queue. SQLite never opens it,
// so closing it drops no lock of SQLite's; flock locks belong to the open
// file. A side file this process cannot open only costs the queue (writes
// fall back to SQLite's busy handler); one the store must not use
// (openSideFile) is refused with a *SideFileError.
func openWriterQueue(path string, timeout time.Duration) (*writerQueue, error) {
	q := &writerQueue{timeout: timeout}
	if !haveFileLocks || path == "" {
		return q, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	f, err := openSideFile(path, path+"-lock", os.O_RDONLY|os.O_CREATE, fi.Mode().Perm())
	if errors.Is(err, fs.ErrPermission) {
		return q, nil
	}
	if err != nil {
		return nil, err
	}
	q.f = f
	return q, nil
}

// lock waits for this process's turn to write, up to the busy timeout,
// and returns the function that ends the turn.
func (q *writerQueue) lock() (unlock func(), err error) {
	if q.f == nil {
		return func() {}, nil
	}
	if q.waited {
		holdBack(politeDelay)
	}
	q.mu.Lock()
	granted := q.granted
	if granted == nil && tryLockFile(q.f) {
		// Nobody holds it: the usual case, with no goroutine to wake.
		q.mu.Unlock()
		q.waited = false
		return q.unlock, nil
	}
	q.waited = true
	if granted == nil {
		granted = make(chan error, 1)
		q.granted = granted
		go q.wait(granted)
	}
	q.abandoned = false
	q.mu.Unlock()

	t := time.NewTimer(q.timeout)
	defer t.Stop()
	select {
	case err = <-granted:
	case <-t.C:
		q.mu.Lock()
		select {
		case err = <-granted: // granted as the timer fired
		default:
			q.abandoned = true
			err = errWritersBusy
		}
		q.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	return q.unlock, nil
}

// wait makes the flock call and hands its outcome to the waiter, or, when
// the waiter gave up, lets the lock go at once.
func (q *writerQueue) wait(granted chan error) {
	err := lockFile(q.f)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.granted = nil
	if q.abandoned || q.closed {
		q.abandoned = false
		if err == nil && !q.closed {
			unlockFile(q.f)
		}
		return
	}
	granted <- err
}

func (q *writerQueue) unlock() { unlockFile(q.f) }

// close closes the side file, which lets go of the lock if held.
func (q *writerQueue) close() error {
	if q.f == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	return q.f.Close()
}
