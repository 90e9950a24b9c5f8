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

// checkpointAfter is how many writes run between two checkpoints: about
// 2,000 pages of WAL. Fewer cost many callers more syncs; more cost a lone
// caller a larger WAL index to search (BenchmarkCallers).
const checkpointAfter = 512

// walSizeLimit is what the WAL file is cut back to once a checkpoint
// has copied all of it and writing starts over at its beginning: a purge
// of many rows grows it, and it should not stay that large.
const walSizeLimit = 16 << 20

// catchUpRounds bounds the background checkpoints of one catch-up, and
// finishFrames is the most frames the last step may leave to the writer.
const (
	catchUpRounds = 8
	finishFrames  = 256
)

var walSizePragma = fmt.Sprintf("journal_size_limit(%d)", walSizeLimit)

// checkpointer copies the WAL back into the database file, passively, on
// a reading connection, away from the writes.
//
// SQLite would otherwise checkpoint inside the commit that crosses its
// threshold, copying and syncing hundreds of writes' pages (10-60 ms)
// while it holds the only writer and the processes' writer queue. A
// passive checkpoint never waits for a writer and never makes one wait.
// Other processes checkpoint on their own; SQLite serialises them.
type checkpointer struct {
	db      *sql.DB
	walPath string // the WAL file, whose size cutBack reads

	mu      sync.Mutex
	writes  int            // since the last checkpoint started
	running bool           // a checkpoint is under way
	wg      sync.WaitGroup // the checkpoint under way, for close
	closed  bool
	due     atomic.Bool // finish has frames to copy
	// backfilled is the WAL's copied frames after the last background
	// round; writerCopied is the most frames the writer's step copied.
	backfilled   atomic.Int64
	writerCopied atomic.Int64
	// sincePurge counts the other writes since the last purge write.
	sincePurge int

	// after is how many writes the next catch-up waits for:
	// checkpointAfter, or fewer while a purge adds many frames a write
	// (see roundFrames). sinceDone counts the writes since the last
	// catch-up ended.
	after     int
	sinceDone int
	// flushes counts the syncs that flush made.
	flushes atomic.Int64
	// last is the WAL as the last round of the last catch-up found it,
	// while a purge runs; only the catch-up under way uses it.
	last walMark
	// limitDue is set from a catch-up's start until the first batch after
	// its end: until then, each batch sets the writer's journal_size_limit
	// to cutBack's first. limited is the limit the writer has (it keeps
	// its one connection, which the DSN started at walSizeLimit); only a
	// batch's leader, one at a time, uses it.
	limitDue atomic.Bool
	limited  int64
}

// walMark is the WAL at one moment: which of its lives (walLife) and how
// many frames it held; known is false when either could not be read.
type walMark struct {
	life   [12]byte
	frames int64
	known  bool
}

// init readies c to checkpoint the WAL at walPath through db, a reading
// connection.
func (c *checkpointer) init(db *sql.DB, walPath string) {
	c.db, c.walPath = db, walPath
	c.after, c.sincePurge = checkpointAfter, purgeQuiet
	c.limited = walSizeLimit // the writer's DSN sets it
}

// purgeQuiet is how many other writes must follow a purge's last write
// before the last step of a checkpoint may run; until then a catch-up's
// call for it is dropped and the WAL grows, to be cut back after the purge.
// Run during the purge, the step makes the next write free megabytes; held
// back until the purge ends, it copies the purge's whole backlog on the
// writer. Dropped, a later catch-up copies that backlog on a reading
// connection. Counting writes, not time, keeps upkeep off the wall clock.
const purgeQuiet = 64

// wrote counts the writes of a batch, and starts a checkpoint when
// enough have gone by and none is running.
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
	// The catch-up may copy every frame (while the writes pause), and
	// then the next write starts the WAL over and cuts it back to the
	// writer's limit, at once, whatever becomes of the writer's step.
	c.limitDue.Store(true)
	c.wg.Go(func() {
		after := c.catchUp(purging)
		c.mu.Lock()
		c.running, c.after, c.sinceDone = false, after, 0
		c.mu.Unlock()
	})
}

// roundFrames is about how many frames the first round of a catch-up
// should find to copy while a purge runs, and minAfter the fewest writes
// a catch-up waits for.
//
// A round that copies a large backlog stalls the writes beside it: its
// sync of the database file holds up theirs. A purge's write adds
// hundreds of frames, so 512 of them left thousands, whose round held a
// concurrent acquirer up for 13-30 ms; rounds of a few hundred frames
// barely show. So while a purge runs a catch-up is due after as many
// writes as added about roundFrames frames the last time.
const (
	roundFrames = 1024
	minAfter    = 16
)

// nextAfter returns how many writes the catch-up after this one waits
// for, given that writes added frames since the last one ended.
func nextAfter(writes int, frames int64) int {
	if writes <= 0 || frames <= 0 {
		return checkpointAfter
	}
	return int(max(minAfter, min(checkpointAfter, roundFrames*int64(writes)/frames)))
}

// catchUp copies the WAL back into the database file in the background.
//
// SQLite writes the WAL over from its beginning, instead of growing it,
// only when a write transaction begins with every frame copied, which a
// checkpoint beside busy writers never achieves. So catchUp checkpoints
// until a round finds few new frames (finishFrames), and the next batch's
// leader copies those on the writer connection (finish), so that the
// batch after it starts the WAL over. A failed checkpoint is harmless: the
// WAL keeps the pages.
//
// It returns how many writes the next catch-up waits for (nextAfter).
func (c *checkpointer) catchUp(purging bool) (after int) {
	after = checkpointAfter
	since := c.last
	c.last = walMark{}
	var wal *os.File // read for the WAL's life while a purge runs
	if purging {
		after = minAfter // until the frames a write are known
		// Opening and closing the WAL file is safe beside SQLite's
		// connections: SQLite keeps its locks on the database and -shm
		// files, none on the WAL, and closing a descriptor releases only
		// the POSIX locks of the file it names.
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
		// No call for the last step: it is dropped while the purge
		// runs, and if the purge ended meanwhile, it would copy on the
		// writer whatever came in during the flush. The next catch-up,
		// due soon, copies that on this connection and calls for it.
		c.flush()
		return after
	}
	if due {
		c.backfilled.Store(copied)
		c.due.Store(true)
	}
	return after
}

// flush writes the pages that a purge's catch-ups copied into the
// database file out to the disk, from the background.
//
// SQLite syncs the database file only after a checkpoint that copied
// every frame, which a catch-up beside a purge never is: otherwise the
// writer's first complete checkpoint after the purge syncs hundreds of
// megabytes at once (about 100 ms), holding up the writes behind it.
//
// The database file cannot be synced through a descriptor of its own:
// closing one releases every POSIX lock the process holds on the file,
// SQLite's included. The WAL file carries no lock, so a descriptor of it
// serves to sync its file system (syncWALFileSystem), which holds the
// database file too. That also writes out whatever else on that file
// system is dirty, so flush runs only during purges, which are rare.
func (c *checkpointer) flush() {
	if syncWALFileSystem(c.walPath) == nil {
		c.flushes.Add(1)
	}
}

// added returns how many frames were written to the WAL between m and
// now: the difference, or all of now's when the WAL started over between
// them. Starting over needs every frame copied back, so the frames of m's
// life that followed m are few; they are not counted.
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

// walLife reads, from wal, what tells one life of the WAL from the next:
// the checkpoint sequence number and the two salts of the WAL file's
// header, which SQLite changes each time it writes the WAL over from its
// beginning. ok is false when wal is nil or cannot be read.
func walLife(wal *os.File) (life [12]byte, ok bool) {
	if wal == nil {
		return life, false
	}
	_, err := wal.ReadAt(life[:], 12)
	return life, err == nil
}

// finish, called by a batch's leader before the batch begins, copies what
// the background checkpoint left, when it is done; while a purge runs, it
// drops that step instead (see purgeQuiet).
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
		// A write between the catch-up and this step may have started
		// the WAL over, and the counts with it: then nothing is known.
		if n := copied - c.backfilled.Load(); n > c.writerCopied.Load() {
			c.writerCopied.Store(n)
		}
	}
}

// limitWAL sets the writer's journal_size_limit to limit, unless it has
// it or limit is 0. A failure leaves the limit set before: the WAL is cut
// back more than a step, or less.
func (c *checkpointer) limitWAL(writer *sql.DB, limit int64) {
	if limit <= 0 || limit == c.limited {
		return
	}
	if _, err := writer.ExecContext(context.Background(), fmt.Sprintf("PRAGMA journal_size_limit = %d", limit)); err == nil {
		c.limited = limit
	}
}

// cutBackStep is the most that one start of the WAL over cuts off it:
// freeing a file's space (about 0.5 ms a megabyte) happens inside the
// write that starts the WAL over.
const cutBackStep = 16 << 20

// cutBack returns the size the next start of the WAL over may leave it
// at: walSizeLimit, or cutBackStep less than its size now, whichever is
// larger; 0 when the size cannot be read (the limit set before stays).
func (c *checkpointer) cutBack() int64 {
	fi, err := os.Stat(c.walPath)
	if err != nil {
		return 0
	}
	return max(walSizeLimit, fi.Size()-cutBackStep)
}

// close waits for the checkpoint under way and starts no other.
func (c *checkpointer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
