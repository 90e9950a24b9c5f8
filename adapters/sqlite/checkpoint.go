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

// checkpointAfter is how many writes run between two checkpoints (about
// 2,000 pages of WAL): fewer cost many callers more syncs, more cost a lone
// caller a larger WAL index to search (BenchmarkCallers).
const checkpointAfter = 512

// walSizeLimit is what the WAL is cut back to once writing starts over at
// its beginning: a purge of many rows grows it.
const walSizeLimit = 16 << 20

// catchUpRounds bounds the background checkpoints of one catch-up, and
// finishFrames is the most frames the last step may leave to the writer.
const (
	catchUpRounds = 8
	finishFrames  = 256
)

var walSizePragma = fmt.Sprintf("journal_size_limit(%d)", walSizeLimit)

// checkpointer copies the WAL back into the database file with passive
// checkpoints on a reading connection, which never wait for a writer nor
// make one wait. SQLite would otherwise checkpoint inside the commit that
// crosses its threshold, syncing hundreds of writes' pages (10-60 ms)
// while it holds the writer and the processes' writer queue.
type checkpointer struct {
	db      *sql.DB
	walPath string // read by cutBack

	mu      sync.Mutex
	writes  int            // since the last checkpoint started
	running bool           // a catch-up is under way
	wg      sync.WaitGroup // the catch-up under way, for close
	closed  bool
	due     atomic.Bool // finish has frames to copy
	// backfilled is the WAL's copied frames after the last background
	// round; writerCopied is the most frames the writer's step copied.
	backfilled   atomic.Int64
	writerCopied atomic.Int64
	sincePurge   int // other writes since the last purge write

	// after is how many writes the next catch-up waits for (nextAfter);
	// sinceDone counts the writes since the last catch-up ended.
	after     int
	sinceDone int
	flushes   atomic.Int64 // syncs made by flush
	// last is the WAL as the last round of the last catch-up found it,
	// while a purge runs; only the catch-up under way uses it.
	last walMark
	// limitDue: from a catch-up's start until the first batch after its
	// end, each batch sets the writer's journal_size_limit to cutBack's.
	// limited is the writer's limit now; only a batch's leader uses it.
	limitDue atomic.Bool
	limited  int64
}

// walMark is the WAL at one moment: its life (walLife) and frames; known
// is false when either could not be read.
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

// purgeQuiet is how many other writes must follow a purge's last write
// before the writer's step of a checkpoint may run; until then it is
// dropped, and a later catch-up copies the purge's backlog on a reading
// connection instead of on the writer. Counting writes keeps upkeep off
// the wall clock.
const purgeQuiet = 64

// wrote counts the writes of a batch, and starts a catch-up when enough
// have gone by and none is running.
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
	// The catch-up may copy every frame, and then the next write starts
	// the WAL over and cuts it back to the writer's limit at once.
	c.limitDue.Store(true)
	c.wg.Go(func() {
		after := c.catchUp(purging)
		c.mu.Lock()
		c.running, c.after, c.sinceDone = false, after, 0
		c.mu.Unlock()
	})
}

// While a purge runs, a catch-up is due after as many writes as added
// about roundFrames frames the last time, but no fewer than minAfter: a
// round that copies a large backlog stalls the writes beside it with its
// sync (thousands of frames held an acquirer up 13-30 ms), and a purge's
// write adds hundreds.
const (
	roundFrames = 1024
	minAfter    = 16
)

// nextAfter returns how many writes the next catch-up waits for, given
// that writes added frames since the last one ended.
func nextAfter(writes int, frames int64) int {
	if writes <= 0 || frames <= 0 {
		return checkpointAfter
	}
	return int(max(minAfter, min(checkpointAfter, roundFrames*int64(writes)/frames)))
}

// catchUp copies the WAL back into the database file in the background,
// and returns how many writes the next catch-up waits for.
//
// SQLite starts the WAL over only when a write begins with every frame
// copied, which a checkpoint beside busy writers never achieves. So
// catchUp runs rounds until one finds few new frames, and the next
// batch's leader copies those on the writer (finish). A failed checkpoint
// is harmless: the WAL keeps the pages.
func (c *checkpointer) catchUp(purging bool) (after int) {
	after = checkpointAfter
	since := c.last
	c.last = walMark{}
	var wal *os.File // read for the WAL's life while a purge runs
	if purging {
		after = minAfter // until the frames a write are known
		// Safe beside SQLite: it keeps no lock on the WAL file, and a
		// close drops only the POSIX locks of the file it names.
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
		// The writer's step is dropped while the purge runs; the next
		// catch-up, due soon, copies what came in and calls for it.
		c.flush()
		return after
	}
	if due {
		c.backfilled.Store(copied)
		c.due.Store(true)
	}
	return after
}

// flush syncs to disk the pages a purge's catch-ups copied into the
// database file: SQLite syncs it only after a complete checkpoint, which
// would then sync hundreds of megabytes at once (about 100 ms) on the
// writer. A descriptor of the database file cannot serve (closing it
// drops SQLite's POSIX locks), so the WAL's syncs its whole file system,
// which is why this runs only during purges.
func (c *checkpointer) flush() {
	if syncWALFileSystem(c.walPath) == nil {
		c.flushes.Add(1)
	}
}

// added returns how many frames were written to the WAL between m and
// now: all of now's when the WAL started over between them (the few of
// m's life after m are not counted).
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

// walLife reads the checkpoint sequence number and salts of the WAL
// header, which change each time SQLite starts the WAL over. ok is false
// when wal is nil or unreadable.
func walLife(wal *os.File) (life [12]byte, ok bool) {
	if wal == nil {
		return life, false
	}
	_, err := wal.ReadAt(life[:], 12)
	return life, err == nil
}

// finish, called by a batch's leader before the batch begins, copies what
// the background catch-up left, unless a purge runs (see purgeQuiet).
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
	ctx := context.Background()
	c.limitWAL(writer, c.cutBack())
	var busy, frames, copied int64
	if writer.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied) == nil {
		// If a write started the WAL over since the catch-up, the counts
		// started over too and nothing is known.
		if n := copied - c.backfilled.Load(); n > c.writerCopied.Load() {
			c.writerCopied.Store(n)
		}
	}
}

// limitWAL sets the writer's journal_size_limit to limit, unless it has it
// or limit is 0; a failure leaves the limit as it was.
func (c *checkpointer) limitWAL(writer *sql.DB, limit int64) {
	if limit <= 0 || limit == c.limited {
		return
	}
	if _, err := writer.ExecContext(context.Background(), fmt.Sprintf("PRAGMA journal_size_limit = %d", limit)); err == nil {
		c.limited = limit
	}
}

// cutBackStep is the most one start of the WAL over cuts off it: freeing
// space (about 0.5 ms a megabyte) happens inside that write.
const cutBackStep = 16 << 20

// cutBack returns the size the next start of the WAL over may leave it at
// (never below walSizeLimit), or 0 when its size cannot be read.
func (c *checkpointer) cutBack() int64 {
	fi, err := os.Stat(c.walPath)
	if err != nil {
		return 0
	}
	return max(walSizeLimit, fi.Size()-cutBackStep)
}

// close waits for the catch-up under way and starts no other.
func (c *checkpointer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
