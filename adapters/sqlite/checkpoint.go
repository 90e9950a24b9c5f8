package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cleveragents/locks/adapters/entstore"
)

const (
	// checkpointAfter is how many writes run between two checkpoints: fewer
	// cost many callers syncs, more a lone caller a larger WAL index to search.
	checkpointAfter = 512
	walSizeLimit    = 16 << 20 // what a WAL that a purge grew is cut back to
	// catchUpRounds bounds a catch-up; finishFrames is the most frames it may leave to the writer.
	catchUpRounds = 8
	finishFrames  = 256
	// purgeQuiet is how many other writes must follow a purge's last before
	// finish may run, so that the backlog is copied off the writer (writes,
	// not time: upkeep stays off the wall clock).
	purgeQuiet = 64
	// During a purge a catch-up is due after as many writes as added about
	// roundFrames frames, no fewer than minAfter: a large round's sync held acquirers.
	roundFrames = 1024
	minAfter    = 16
	// cutBackStep is the most one start of the WAL over cuts off it, since
	// that write frees the space (about 0.5 ms a megabyte).
	cutBackStep = 16 << 20
)

var walSizePragma = fmt.Sprintf("journal_size_limit(%d)", walSizeLimit)

// checkpointer copies the WAL back with passive checkpoints on a reading
// connection, never waiting for a writer nor making one wait: SQLite's own,
// inside a commit, held the writer queue 10-60 ms.
type checkpointer struct {
	db      *sql.DB
	walPath string

	mu         sync.Mutex
	writes     int // since the last catch-up started
	running    bool
	wg         sync.WaitGroup // the catch-up under way
	closed     bool
	sincePurge int // other writes since the last purge write
	after      int // writes the next catch-up waits for (nextAfter)
	sinceDone  int // writes since the last catch-up ended

	due          atomic.Bool  // finish has frames to copy
	backfilled   atomic.Int64 // frames copied by the last background round
	writerCopied atomic.Int64 // the most frames finish copied
	flushes      atomic.Int64
	// last is the WAL as the last catch-up's last round found it during a purge.
	last walMark
	// limitDue: from a catch-up's start until the first batch after its end,
	// each batch's leader sets the writer's journal_size_limit (limited) to cutBack's.
	limitDue atomic.Bool
	limited  int64
}

// walMark is the WAL's life (walLife) and frames at one moment, if known.
type walMark struct {
	life   [12]byte
	frames int64
	known  bool
}

func (c *checkpointer) init(db *sql.DB, walPath string) {
	c.db, c.walPath = db, walPath
	c.after, c.sincePurge = checkpointAfter, purgeQuiet
	c.limited = walSizeLimit // the writer's DSN sets it
}

// wrote counts the writes of a batch, and starts a catch-up when due.
func (c *checkpointer) wrote(batch []*txCall) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, call := range batch {
		if call.kind == entstore.Cleanup {
			if c.sincePurge >= purgeQuiet {
				// A purge starts: learn its frames a write soon.
				c.after = min(c.after, minAfter)
			}
			c.sincePurge = 0
		} else {
			c.sincePurge++
		}
	}
	c.writes += len(batch)
	c.sinceDone += len(batch)
	if c.writes < c.after || c.running || c.closed {
		return
	}
	purging := c.sincePurge < purgeQuiet
	c.writes, c.running = 0, true
	c.limitDue.Store(true) // the catch-up may copy every frame, and the next write cut the WAL
	c.wg.Go(func() {
		after := c.catchUp(purging)
		c.mu.Lock()
		c.running, c.after, c.sinceDone = false, after, 0
		c.mu.Unlock()
	})
}

func nextAfter(writes int, frames int64) int {
	if writes <= 0 || frames <= 0 {
		return checkpointAfter
	}
	return int(max(minAfter, min(checkpointAfter, roundFrames*int64(writes)/frames)))
}

// catchUp copies the WAL back in the background and returns how many writes
// the next catch-up waits for. SQLite starts the WAL over only when a write
// finds every frame copied, which rounds beside busy writers never achieve:
// so it runs rounds until few new frames are left to the batch leader (finish).
func (c *checkpointer) catchUp(purging bool) (after int) {
	after = checkpointAfter
	since := c.last
	c.last = walMark{}
	var wal *os.File // read for the WAL's life while a purge runs
	if purging {
		after = minAfter // until the frames a write are known
		// SQLite keeps no POSIX lock on the WAL file, which close drops.
		if f, err := os.Open(c.walPath); err == nil {
			defer f.Close()
			wal = f
		}
	}
	var copied int64
	due, prev := false, int64(-1)
	for round := 0; round < catchUpRounds && !due; round++ {
		var busy, frames int64
		before, known := walLife(wal)
		err := c.db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied)
		if err != nil || busy != 0 {
			break
		}
		if life, ok := walLife(wal); known && ok && life == before {
			c.last = walMark{life: life, frames: frames, known: true}
		} else {
			c.last = walMark{} // unread, or the WAL started over during the round
		}
		if round == 0 && purging {
			if added, ok := since.added(c.last); ok {
				c.mu.Lock()
				writes := c.sinceDone
				c.mu.Unlock()
				after = nextAfter(writes, added)
			}
		}
		due, prev = prev >= 0 && frames-prev <= finishFrames, frames
	}
	if purging {
		c.flush() // no call for finish, which a purge drops
		return after
	}
	if due {
		c.backfilled.Store(copied)
		c.due.Store(true)
	}
	return after
}

// flush syncs the pages a purge's catch-ups copied, which SQLite would sync
// on the writer (about 100 ms). It syncs the WAL's whole file system (closing
// a descriptor of the database would drop SQLite's POSIX locks): only purges do.
func (c *checkpointer) flush() {
	if syncWALFileSystem(c.walPath) == nil {
		c.flushes.Add(1)
	}
}

// added returns the frames written between m and now: all of now's if the
// WAL started over between them (the few of m's life after m left out).
func (m walMark) added(now walMark) (int64, bool) {
	switch {
	case !m.known || !now.known:
		return 0, false
	case now.life != m.life:
		return now.frames, true
	case now.frames >= m.frames:
		return now.frames - m.frames, true
	}
	return 0, false
}

// walLife reads the WAL header's checkpoint sequence number and salts,
// which change each time SQLite starts the WAL over.
func walLife(wal *os.File) (life [12]byte, ok bool) {
	if wal == nil {
		return life, false
	}
	_, err := wal.ReadAt(life[:], 12)
	return life, err == nil
}

// finish, run by a batch's leader before the batch, copies what the catch-up left, unless a purge runs.
func (c *checkpointer) finish(writer *sql.DB) {
	if c.limitDue.Load() {
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		if !running {
			c.limitDue.Store(false) // this batch's limit is the last one needed
		}
		c.limitWAL(writer, c.cutBack())
	}
	if !c.due.Load() {
		return
	}
	c.mu.Lock()
	purging := c.sincePurge < purgeQuiet
	c.mu.Unlock()
	if !c.due.CompareAndSwap(true, false) || purging {
		return
	}
	c.limitWAL(writer, c.cutBack())
	var busy, frames, copied int64
	if writer.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied) == nil {
		// (A write that started the WAL over restarted the counts too.)
		if n := copied - c.backfilled.Load(); n > c.writerCopied.Load() {
			c.writerCopied.Store(n)
		}
	}
}

// limitWAL sets the writer's journal_size_limit, unless limit is 0 or set.
func (c *checkpointer) limitWAL(writer *sql.DB, limit int64) {
	if limit <= 0 || limit == c.limited {
		return
	}
	if _, err := writer.ExecContext(context.Background(), fmt.Sprintf("PRAGMA journal_size_limit = %d", limit)); err == nil {
		c.limited = limit
	}
}

// cutBack returns the size the next start of the WAL over may leave, or 0.
func (c *checkpointer) cutBack() int64 {
	fi, err := os.Stat(c.walPath)
	if err != nil {
		return 0
	}
	return max(walSizeLimit, fi.Size()-cutBackStep)
}

func (c *checkpointer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
