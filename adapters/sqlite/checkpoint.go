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

// checkpointAfter is how many writes run between two checkpoints. A write
// changes about four pages (the row and its three indexes), so this is
// about twice SQLite's own default of a checkpoint per 1,000 pages of WAL.
// Measured with BenchmarkCallers, interleaved: 256 writes cost 32 callers
// about 10 % more time per cycle than 512 (each checkpoint syncs two
// files, whatever it copies); 1,024 cost a lone caller 15 % more than
// 256, presumably because its reads search a larger WAL index; 512 costs
// it about 5 %.
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
// threshold (wal_autocheckpoint, 1,000 pages): that commit then copies
// and syncs the pages of hundreds of earlier writes, 10-60 ms on this
// kind of machine, while it holds this process's only writer connection
// and the processes' writer queue, so that every write behind it waits.
// The writer connection has automatic checkpoints turned off, and the
// leader of a batch starts a checkpoint here, at most one at a time, once
// enough writes have gone by. A passive checkpoint never waits for a
// writer and never makes one wait: it copies what no reader still needs
// and stops. Other processes' writers do their own checkpoints; SQLite
// serialises them.
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
// before the last step of a checkpoint may run. Until then, a catch-up's
// call for that step is dropped, and the WAL grows; it is cut back after
// the purge. Counting writes rather than time keeps upkeep off the wall
// clock. Measured with a concurrent acquirer during and after a purge of
// 500,000 rows (4 interleaved runs of each):
//
//   - Running the step during the purge: once it has run, the next write
//     starts the WAL over and cuts it back, freeing megabytes inside that
//     write. The acquirer's worst cycle during the purge was 35-49 ms;
//     with the WAL started over but not cut back, still 36-41 ms.
//   - Holding the step back until the purge ended: 13-18 ms during the
//     purge, but the step then copied every frame the purge had added
//     since the catch-up, and stalled the writer for 45-56 ms: the
//     acquirer's worst cycle after the purge was 15-43 ms.
//   - Dropping it (this): 12-14 ms during the purge, 9-24 ms after it. A
//     catch-up that starts after the purge copies the backlog on a reading
//     connection and calls for the step again when few frames are left.
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
// sync of the database file holds up theirs. An ordinary write adds a few
// frames, so 512 of them leave a backlog of a few thousand at most. A
// purge's write deletes up to thousands of rows and adds hundreds: 512
// writes of a purge of 500,000 rows, with an acquirer beside it, left
// 3,000-22,000 frames, whose first round took 43-164 ms and held the
// acquirer's cycle up for 13-30 ms each time, while rounds of a few
// hundred frames took at most 10 ms and barely showed. So, while a purge
// runs, a catch-up is due after as many writes as added about
// roundFrames frames the last time. Measured with that acquirer during
// the purge, 12 interleaved runs of each, on a 2-core machine: its worst
// cycle was 5.3-20.9 ms (7.3 ms the median run), against 9.0-29.6 ms
// (13.3 ms) with a catch-up every 512 writes; the purge took about 10 %
// longer (more syncs).
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
// only when a write transaction begins while every frame has been copied,
// which a checkpoint running beside busy writers never achieves: they add
// frames while it copies. So catchUp checkpoints again until a round finds
// few new frames (finishFrames), and then the next leader of a batch
// copies those few on the writer connection, between two batches
// (finish), so that the batch after it starts the WAL over. Copying a
// frame there costs about 2.5 µs, plus about a millisecond to sync the
// files, on this kind of machine; a writer waits that long once per
// checkpoint. While writes come faster than that, or a purge runs, the
// WAL grows instead, and is started over and cut back (cutBack) later.
//
// A failed checkpoint is harmless: the WAL keeps the pages, and the next
// one copies them.
//
// It returns how many writes the next catch-up waits for: while a purge
// runs, after as many writes as add about roundFrames frames (nextAfter),
// counted from the WAL's frames now and when the last catch-up ended.
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
// SQLite syncs the database file only at the end of a checkpoint that
// copied every frame, which a catch-up beside a purge's writes never is:
// the pages it copies stay dirty in the page cache, hundreds of
// megabytes after a purge of 500,000 rows, until the first checkpoint
// that completes, the writer's last step after the purge, syncs them
// all. That sync took 83-102 ms on the writer (seen with strace), and
// held up the next writes as long. Flushed after each catch-up of the
// purge instead, a few megabytes at a time: with an acquirer during and
// after a purge of 500,000 rows, 12 interleaved runs of each build, its
// worst cycle after the purge was 11.9-24.3 ms (14.6 ms in the median
// run) against 25.9-142.5 ms (121.4 ms); during the purge, 5.2-23.6 ms
// (8.3 ms) against 5.6-12.5 ms (8.6 ms). The purge took about 8 %
// longer.
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

// cutBackStep is the most that one start of the WAL over cuts off it.
// Freeing a file's space costs about half a millisecond a megabyte here,
// inside the write that starts the WAL over: cut back at once, a WAL grown
// to hundreds of megabytes by a purge stalled that write for 113 ms.
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
