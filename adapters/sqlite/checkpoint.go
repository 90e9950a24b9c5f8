package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
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
	db *sql.DB

	mu      sync.Mutex
	writes  int            // since the last checkpoint started
	running bool           // a checkpoint is under way
	wg      sync.WaitGroup // the checkpoint under way, for close
	closed  bool
	due     atomic.Bool // finish has frames to copy
}

// wrote counts n writes, and starts a checkpoint when enough have gone by
// and none is running.
func (c *checkpointer) wrote(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes += n
	if c.writes < checkpointAfter || c.running || c.closed {
		return
	}
	c.writes, c.running = 0, true
	c.wg.Go(func() {
		c.catchUp()
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	})
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
// checkpoint. While writes come faster than that (a large purge), the WAL
// grows instead, and is started over, and cut back to walSizeLimit, once
// they slow down.
//
// A failed checkpoint is harmless: the WAL keeps the pages, and the next
// one copies them.
func (c *checkpointer) catchUp() {
	last := -1
	for range catchUpRounds {
		var busy, frames, copied int
		err := c.db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied)
		if err != nil || busy != 0 {
			return
		}
		if last >= 0 && frames-last <= finishFrames {
			c.due.Store(true)
			return
		}
		last = frames
	}
}

// finish, called by a batch's leader before the batch begins, copies what
// the background checkpoint left, when it is done.
func (c *checkpointer) finish(writer *sql.DB) {
	if c.due.CompareAndSwap(true, false) {
		_, _ = writer.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)")
	}
}

// close waits for the checkpoint under way and starts no other.
func (c *checkpointer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
