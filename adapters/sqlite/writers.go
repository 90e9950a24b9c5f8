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
// SQLite alone queues writers with its busy handler, which sleeps and
// retries in growing steps of up to 100 ms: a waiting process keeps
// missing its turn while others commit, and one cycle took 0.6-1.7 s with
// 4 processes on one file. A process waiting for a file lock is woken by
// the kernel the moment the holder lets go. SQLite's own lock still
// decides who writes; the file lock only orders the processes that ask,
// so a process that does not take it (an older version of the module, the
// sqlite3 shell) still writes safely, just without the queue.
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
// back before asking for the next. The kernel wakes the next process when
// the lock is let go, but that process still has to be scheduled, while
// this one asks again within microseconds and would win the lock over and
// over: 4 processes on one file got between 0.42 and 0.76 of each other's
// cycles. Holding back while others are known to be waiting hands the
// turn over instead; without contention it costs nothing, since the last
// turn did not wait.
//
// The pause is a nanosleep of the thread (holdBack), not time.Sleep,
// whose timers wake on this kind of machine after about a millisecond
// however short the sleep asked for. Measured with 4 processes on one
// file, 8 s, 3 interleaved runs each: a millisecond gave fairness
// 0.82-0.91 and a p99 cycle of 7.1-7.4 ms; 200 µs gave 0.90-0.96 and
// 5.0-5.9 ms, at the same throughput; 50 µs fell in between.
const politeDelay = 200 * time.Microsecond

// openWriterQueue opens the side file of the database at path, creating
// it with the database's own permissions, as SQLite does for its -wal and
// -shm files, so that every user who may write the database may queue.
// It opens it read-only, which is all flock needs. It is a file of the
// module's own, which SQLite never opens: closing it drops no lock of
// SQLite's, and flock locks belong to the open file, not the process. A side file that this
// process cannot open (another user's, more private than the database)
// only costs the queue: the writes go through SQLite's busy handler, as
// they did before the queue existed. Something at the side file's name
// that the store must not use (a symbolic link, a FIFO, another user's
// file: see openSideFile) is refused with a *SideFileError, unchanged.
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
