//go:build linux

package sqlite

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// wakeFile carries wake-ups between the processes that share a database,
// through "<database>-wake" (docs/architecture.md, "Hand-over between
// processes"): a release writes a random value into its resource's slot,
// if anyone watches it; waiters watch the file with inotify; each waiting
// store holds an OFD read lock on its slot's byte past wakeWaitersAt (for
// Contended; the kernel drops it when the process dies) and counts itself
// in the page every process maps, so that a release where nobody waits
// reads a zero and makes no system call.
type wakeFile struct {
	f        *os.File
	db       string                // the database, as sidePath resolved it
	path     string                // db + "-wake"
	writable bool                  // false: this process may watch but not write (another user's file)
	dev, ino uint64                // which file f is
	counts   []byte                // the mapped page of watch counts; nil: unknown, as if someone watched
	gens     [wakeSlots + 1]uint32 // the page's generation each count of this store went into
	checked  time.Time

	mu       sync.Mutex
	in       *inotifyInstance // while a watch of this store is on; nil otherwise
	wd       int32
	last     [wakeSlots + 1]uint64
	subs     [wakeSlots + 1]map[*wakeSub]struct{}
	watchers [wakeSlots + 1]int       // watches per slot: the OFD lock is held while > 0
	watching int                      // watches in all
	places   map[*queuePlace]struct{} // this store's places in the queues of waiters (queue_linux.go)
	closed   bool
}

// haveWakeFile: Open opens the wake file here.
const haveWakeFile = true

type wakeSub struct{ c chan struct{} }

// wakeRecheck is how often a store looks at the path unasked.
var wakeRecheck = time.Second

const (
	wakeSlots     = 256     // slots the resources hash to; slot 0 is "every resource"
	wakeWaitersAt = 1 << 20 // the waiters' lock bytes, one per slot (past the end of the file)
	// wakeCountsAt is the page of the watch counts, a uint32 per slot;
	// slot 0's, which nobody watches, is set when the file was replaced.
	wakeCountsAt = 4096
	wakeGenSlot  = 1023 // the generation: the page's last word
)

// openWakeFile opens, or creates with the database's permissions, the
// wake file of the database at path (resolved by sidePath). It returns
// nil and no error where it cannot (waiters then poll), and refuses (a
// *SideFileError, *MountedFileError) a file another user may have planted,
// or a bind mount (openSideFile).
func openWakeFile(path string) (*wakeFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil
	}
	w := &wakeFile{db: path, path: path + "-wake"}
	if w.f, w.writable, err = w.open(fi.Mode().Perm()); err != nil {
		if refusedSideFile(err) {
			return nil, err
		}
		return nil, nil
	}
	w.identify()
	w.checked = time.Now() // the path was just looked at: recheck is not due yet
	return w, nil
}

// identify notes which file w.f is, for refresh, and maps its counts,
// growing the file to hold them (never where it may not write).
func (w *wakeFile) identify() {
	var st unix.Stat_t
	fd := int(w.f.Fd())
	if w.counts = nil; unix.Fstat(fd, &st) != nil {
		return
	}
	w.dev, w.ino = st.Dev, st.Ino
	if !w.writable || st.Size < wakeCountsAt+4096 && unix.Ftruncate(fd, wakeCountsAt+4096) != nil {
		return
	}
	w.counts, _ = unix.Mmap(fd, wakeCountsAt, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if _, ok := w.gen(); !ok {
		w.othersMarked() // a new page is trusted if nobody waits (who could not have counted)
	}
}

// add adds d to slot's count and returns the sum, with w.mu held. Anyone
// who may write the file can truncate it under the mapping: the lost page
// faults, and instead of dying of SIGBUS the store drops the counts and
// wakes as if someone watched (ok false).
func (w *wakeFile) add(slot int, d uint32) (n uint32, ok bool) {
	if w.counts == nil {
		return 0, false
	}
	defer func() {
		if recover() != nil {
			w.dropCounts()
			n, ok = 0, false
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	p := (*uint32)(unsafe.Pointer(&w.counts[4*slot]))
	for d == ^uint32(0) { // a decrement stops at zero, where a truncation took the count
		if n = atomic.LoadUint32(p); n == 0 || atomic.CompareAndSwapUint32(p, n, n-1) {
			return max(n, 1) - 1, true
		}
	}
	return atomic.AddUint32(p, d), true
}

// cas is atomic.CompareAndSwapUint32 on slot's count, guarded as add is.
func (w *wakeFile) cas(slot int, old, new uint32) {
	if w.counts == nil {
		return
	}
	defer func() {
		if recover() != nil {
			w.dropCounts()
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	atomic.CompareAndSwapUint32((*uint32)(unsafe.Pointer(&w.counts[4*slot])), old, new)
}

// gen reads the page's generation, the last word of the page: a
// truncation anywhere in the page zeroes one of its bytes, which a valid
// generation never has. Counts are trusted only under a valid one (ok).
func (w *wakeFile) gen() (g uint32, ok bool) {
	g, mapped := w.add(wakeGenSlot, 0)
	return g, mapped && g&0xff != 0 && g&0xff00 != 0 && g&0xff0000 != 0 && g&0xff000000 != 0
}

// trust gives the page a new generation, once no store marks a wait
// anywhere: then no waiter's count is missing from it.
func (w *wakeFile) trust() {
	if g, ok := w.gen(); !ok && w.counts != nil {
		w.cas(wakeGenSlot, g, rand.Uint32()|0x01010101)
	}
}

// uncount takes this store's count on slot off the page, if it went into
// the page's present generation: one lost to a truncation is not there.
func (w *wakeFile) uncount(slot int) {
	if g, ok := w.gen(); ok && g == w.gens[slot] {
		w.add(slot, ^uint32(0))
	}
}

func (w *wakeFile) dropCounts() {
	_ = unix.Munmap(w.counts)
	w.counts = nil
}

// watched reports whether any store of any process may watch slot (0:
// any slot), with w.mu held. The read is a full barrier (an add), which
// orders it after the release's commit: a watcher counted after it
// looks at the store after the commit.
func (w *wakeFile) watched(slot int) bool {
	if _, ok := w.gen(); !ok {
		return true
	}
	for s := max(slot, 1); s <= wakeSlots && (s == slot || slot == 0); s++ {
		if n, ok := w.add(s, 0); n > 0 || !ok {
			return true
		}
	}
	return false
}

// recheck is refresh where nobody may wait, which makes no system call:
// once a second, or at once if a process that found the file replaced
// said so here. Until then a replaced file only delays the hand-over to
// waiters on the new one, and their fallback reads bound that anyway.
// Counts lost to a truncation are mapped again once a second.
func (w *wakeFile) recheck() {
	flagged, counted := w.add(0, 0)
	now := time.Now()
	due := now.Sub(w.checked) >= wakeRecheck
	if counted && flagged == 0 && !due {
		return
	}
	if due {
		w.checked = now
	}
	if !w.refresh() && flagged != 0 {
		w.cas(0, flagged, 0) // the flagged file is at the path again
	}
	if w.counts == nil && w.writable && due {
		w.identify()
		for slot, n := range w.watchers {
			if n > 0 {
				w.add(slot, 1)
				w.gens[slot], _ = w.gen()
			}
		}
	}
}

// open opens the wake file, creating it with perm, or only for reading
// where this user may not write it (openSideFile).
func (w *wakeFile) open(perm os.FileMode) (f *os.File, writable bool, err error) {
	f, err = openSideFile(w.db, w.path, os.O_RDWR|os.O_CREATE, perm)
	if errors.Is(err, fs.ErrPermission) {
		f, err = openSideFile(w.db, w.path, os.O_RDONLY, 0)
		return f, false, err
	}
	if err == nil {
		_ = f.Chmod(perm) // undo the umask: whoever may write the database must signal
		// Root's file would leave the owner's waiters unable to count
		// themselves: root gives it to the database's owner, as SQLite
		// does its -wal and -shm.
		if o := ownerOf(w.db); os.Geteuid() == 0 && o.uid != 0 {
			_ = f.Chown(int(o.uid), int(o.gid))
		}
	}
	return f, err == nil, err
}

var _ application.Wakeups = (*wakeFile)(nil)

func wakeSlot(ref domain.ResourceRef) int {
	h := fnv.New64a()
	h.Write([]byte(ref.Type))
	h.Write([]byte{0})
	h.Write([]byte(ref.ID))
	return int(h.Sum64()%wakeSlots) + 1
}

// freed tells waiting processes that the locks on refs (none: any) came free.
func (w *wakeFile) freed(refs ...domain.ResourceRef) {
	if w == nil {
		return
	}
	if len(refs) == 0 {
		w.bump(0)
		return
	}
	for _, ref := range refs {
		w.bump(wakeSlot(ref))
	}
}

// bump writes a new value into slot if anyone watches it. A failure is
// ignored: waiters find the release on their fallback reads.
func (w *wakeFile) bump(slot int) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64()|1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recheck()
	if w.writable && w.watched(slot) && (slot != 0 || w.othersMarked()) {
		_, _ = w.f.WriteAt(b[:], int64(slot)*8)
	}
}

// othersMarked reports, for a release of any resource, whether another
// store marks a wait on any slot; if none does, it puts right the counts
// that dead watchers left (see Contended for why that hides no new one).
func (w *wakeFile) othersMarked() bool {
	var seen [wakeSlots + 1]uint32
	for s := 1; s <= wakeSlots; s++ {
		seen[s], _ = w.add(s, 0)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: wakeWaitersAt + 1, Len: wakeSlots}
	if unix.FcntlFlock(w.f.Fd(), unix.F_OFD_GETLK, &lk) != nil || lk.Type != unix.F_UNLCK {
		return true
	}
	w.trust()
	for s := 1; s <= wakeSlots; s++ {
		if mine := uint32(min(w.watchers[s], 1)); seen[s] > mine {
			w.cas(s, seen[s], mine)
		}
	}
	return false
}

// Contended implements application.Wakeups.
func (w *wakeFile) Contended(ref domain.ResourceRef) bool {
	slot := wakeSlot(ref)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: wakeWaitersAt + int64(slot), Len: 1}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recheck()
	var n, mine uint32
	counted := false
	_, trusted := w.gen()
	if n, counted = w.add(slot, 0); counted && trusted {
		if mine = uint32(min(w.watchers[slot], 1)); n <= mine {
			return false // only this store watches (its lock is invisible to it)
		}
	}
	if !trusted {
		lk.Start, lk.Len = wakeWaitersAt+1, wakeSlots // nobody anywhere: the page can be trusted
	}
	if err := unix.FcntlFlock(w.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false
	}
	if lk.Type == unix.F_UNLCK && !trusted {
		w.trust()
	} else if lk.Type == unix.F_UNLCK && counted {
		// Counted, yet nobody else holds a mark: watchers that died. A
		// watcher locks before it counts and uncounts before it unlocks,
		// so one that came since changed the count, and this fails.
		w.cas(slot, n, mine)
	}
	return lk.Type != unix.F_UNLCK
}

// Watch implements application.Wakeups.
func (w *wakeFile) Watch(ref domain.ResourceRef) (<-chan struct{}, func()) {
	slot := wakeSlot(ref)
	sub := &wakeSub{c: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refresh()
	if w.in == nil && !w.closed {
		w.start() // again after a failure: the system may have watches free by now
	}
	if w.in == nil {
		return nil, func() {} // the waiter polls
	}
	if w.subs[slot] == nil {
		w.subs[slot] = make(map[*wakeSub]struct{})
	}
	w.subs[slot][sub] = struct{}{}
	w.watching++
	if w.watchers[slot]++; w.watchers[slot] == 1 {
		w.mark(slot, true)
	}
	var once sync.Once
	return sub.c, func() { once.Do(func() { w.unwatch(slot, sub) }) }
}

func (w *wakeFile) unwatch(slot int, sub *wakeSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs[slot], sub)
	if w.watchers[slot]--; w.watchers[slot] == 0 && !w.closed {
		w.mark(slot, false)
	}
	if w.watching--; w.watching == 0 && w.in != nil && !w.closed {
		w.stop() // the next Watch starts over
	}
}

// mark takes (on) or lets go of this store's mark that it waits for a
// resource of slot: the lock, then the count, and the other way round
// (see Contended). A lock that fails leaves the waiter uncounted: it
// finds releases on its fallback reads.
func (w *wakeFile) mark(slot int, on bool) {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: wakeWaitersAt + int64(slot), Len: 1}
	switch {
	case on && unix.FcntlFlock(w.f.Fd(), unix.F_OFD_SETLK, &lk) == nil:
		w.add(slot, 1)
		w.gens[slot], _ = w.gen() // read after: a page trusted since holds this count
	case !on:
		w.uncount(slot)
		lk.Type = unix.F_UNLCK
		_ = unix.FcntlFlock(w.f.Fd(), unix.F_OFD_SETLK, &lk)
	}
}

// wakeEvents: a write, and a change of the file's links (removed,
// replaced, renamed away), after which releases go to another file.
const wakeEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVE_SELF

// start watches the file open here (through /proc, else its name, never
// followed), with w.mu held, and reads the slots once the watch is on, so
// no release falls between. Without a watch, w.in stays nil: waiters poll.
func (w *wakeFile) start() {
	in, wd, ok := inotify.watch(w, fmt.Sprintf("/proc/self/fd/%d", w.f.Fd()), w.path)
	if !ok {
		return
	}
	w.in, w.wd = in, wd
	w.readSlots()
}

// stop takes this store's watch off, with w.mu held (see inotifier.unwatch).
func (w *wakeFile) stop() (done <-chan struct{}) {
	done = inotify.unwatch(w.in, w.wd, w)
	w.in, w.wd = nil, 0
	return done
}

// heard handles the events of in's watch wd, which w had when they were read.
func (w *wakeFile) heard(in *inotifyInstance, wd int32, mask uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.in != in || w.wd != wd {
		return // stopped, or moved to another watch, since they were read
	}
	all := mask&unix.IN_Q_OVERFLOW != 0                   // events were dropped
	gone := mask&unix.IN_IGNORED != 0                     // the watch was removed
	moved := mask&(unix.IN_ATTRIB|unix.IN_MOVE_SELF) != 0 // its links changed
	if (moved || all) && !gone {
		w.refresh() // releases may go to another file now
		if w.in != in || w.wd != wd {
			return // refresh moved the watch, and woke everyone
		}
	}
	switch {
	case gone: // nothing is heard on it again: everyone looks, the next Watch starts over
		w.in, w.wd = nil, 0
		w.wakeAll()
	case all:
		w.readSlots()
		w.wakeAll()
	default:
		w.wakeChanged()
	}
}

// refresh makes sure, with w.mu held, that the file open here is the one
// at the path (a removed or replaced one reaches no one): if not, it moves
// the marks and the watch to the one there and wakes every watcher, since
// a release may have gone there. One lstat(2) when nothing changed.
func (w *wakeFile) refresh() (replaced bool) {
	var cur unix.Stat_t
	if w.closed {
		return false
	}
	if err := unix.Lstat(w.path, &cur); err == nil && cur.Dev == w.dev && cur.Ino == w.ino {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(int(w.f.Fd()), &st) != nil {
		return false
	}
	f, writable, err := w.open(os.FileMode(st.Mode).Perm())
	if err != nil {
		return false // none can be made, or a planted one: waiters fall back on reads
	}
	old := w.f
	w.add(0, 1) // whoever maps it looks at the path now
	w.unmark()
	w.f, w.writable = f, writable
	w.identify()
	for slot, n := range w.watchers {
		if n > 0 {
			w.mark(slot, true)
		}
	}
	for p := range w.places {
		_ = p.lock(unix.F_RDLCK) // in the new file's order, by their numbers in the old one
	}
	old.Close() // drops only our marks there
	if in, wd := w.in, w.wd; in != nil {
		// The new watch first: after the process's last, the instance would close.
		w.in, w.wd = nil, 0
		w.start()
		inotify.unwatch(in, wd, w)
		w.wakeAll()
	}
	return true
}

// readSlots reads every slot's value into w.last, with w.mu held, and
// returns the values it read before.
func (w *wakeFile) readSlots() (before [wakeSlots + 1]uint64) {
	before = w.last
	var b [(wakeSlots + 1) * 8]byte
	n, _ := w.f.ReadAt(b[:], 0) // a short file: the slots past its end are zero
	clear(b[n:])
	for i := range w.last {
		w.last[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return before
}

// wakeChanged re-reads the slots and wakes the watchers of those that
// changed, with w.mu held; a change of slot 0 wakes every watcher.
func (w *wakeFile) wakeChanged() {
	before := w.readSlots()
	if w.last[0] != before[0] {
		w.wakeAll()
		return
	}
	for slot := 1; slot <= wakeSlots; slot++ {
		if w.last[slot] != before[slot] {
			for sub := range w.subs[slot] {
				notify(sub.c)
			}
		}
	}
}

func (w *wakeFile) wakeAll() {
	for _, subs := range w.subs {
		for sub := range subs {
			notify(sub.c)
		}
	}
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// close stops the watch and closes the file, which drops the locks.
func (w *wakeFile) close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	var done <-chan struct{}
	if w.in != nil {
		done = w.stop()
	}
	w.closed = true
	w.unmark()
	w.mu.Unlock()
	if done != nil {
		<-done // this store's watch was the process's last: its reader ends
	}
	return w.f.Close()
}

// unmark takes this store's counts off the mapped page and unmaps it,
// with w.mu held; the file's closing lets go of the locks.
func (w *wakeFile) unmark() {
	for slot, n := range w.watchers {
		if n > 0 {
			w.uncount(slot)
		}
	}
	if w.counts != nil {
		w.dropCounts()
	}
}

// inotify is the process's one inotify instance, shared by every store's
// watches (a user has few: max_user_instances, 128 by default), open from
// the first watch to the last.
var inotify inotifier

// inotifyInit is inotify_init1(2); tests make it fail.
var inotifyInit = unix.InotifyInit1

// inotifier keeps the instance and who listens to each watch. Lock order:
// wakeFile.mu, then inotifier.mu; the reader hands events on without it.
type inotifier struct {
	mu sync.Mutex
	in *inotifyInstance // nil: no watch is on
}

// inotifyInstance is one instance and its reader; a watch descriptor of a
// closed instance must not reach a store watching on the next.
type inotifyInstance struct {
	f  *os.File // non-blocking: reads wait in the runtime's poller
	fd int
	// subs: the stores listening to each watch. inotify gives the stores
	// of one file the same watch, removed when its last store stops.
	subs map[int32]map[*wakeFile]struct{}
	done chan struct{} // closed when the reader has ended
}

// watch adds a watch on w's file, through fdPath or else path, opening the
// instance if need be; ok is false where none can be had: waiters poll.
func (n *inotifier) watch(w *wakeFile, fdPath, path string) (in *inotifyInstance, wd int32, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	in = n.in
	if in == nil {
		fd, err := inotifyInit(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			return nil, 0, false // EMFILE: the user's inotify instances are all taken
		}
		in = &inotifyInstance{fd: fd, subs: make(map[int32]map[*wakeFile]struct{})}
	}
	wd, err := addWatch(in.fd, fdPath, path)
	if err != nil {
		if n.in == nil {
			unix.Close(in.fd)
		}
		return nil, 0, false
	}
	if n.in == nil {
		in.f = os.NewFile(uintptr(in.fd), "inotify")
		in.done = make(chan struct{})
		n.in = in
		go n.read(in)
	}
	if in.subs[wd] == nil {
		in.subs[wd] = make(map[*wakeFile]struct{})
	}
	in.subs[wd][w] = struct{}{}
	return in, wd, true
}

func addWatch(fd int, fdPath, path string) (int32, error) {
	const events = wakeEvents | unix.IN_MASK_ADD // a second store never takes the first's events
	wd, err := unix.InotifyAddWatch(fd, fdPath, events)
	if err != nil {
		wd, err = unix.InotifyAddWatch(fd, path, events|unix.IN_DONT_FOLLOW)
	}
	return int32(wd), err
}

// unwatch stops w listening to in's watch wd, removing the watch and then
// the instance when nobody listens; it returns the done channel of a
// closed instance's reader (which only a caller holding no lock may await).
func (n *inotifier) unwatch(in *inotifyInstance, wd int32, w *wakeFile) (done <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if in == nil || n.in != in {
		return nil // that instance has failed and closed since
	}
	subs := in.subs[wd]
	if _, ok := subs[w]; !ok {
		return nil // inotify removed the watch (IN_IGNORED) already
	}
	delete(subs, w)
	if len(subs) == 0 {
		delete(in.subs, wd)
		_, _ = unix.InotifyRmWatch(in.fd, uint32(wd))
	}
	if len(in.subs) == 0 {
		return n.close(in)
	}
	return nil
}

// close closes in, the current instance, with n.mu held.
func (n *inotifier) close(in *inotifyInstance) <-chan struct{} {
	n.in = nil
	in.f.Close()
	return in.done
}

// heard is an event to hand to a store.
type heard struct {
	w    *wakeFile
	wd   int32
	mask uint32
}

// read hands in's events to the stores listening to their watch until in closes.
func (n *inotifier) read(in *inotifyInstance) {
	defer close(in.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	var masks map[int32]uint32
	var to []heard
	for {
		nr, err := in.f.Read(buf)
		to = to[:0]
		n.mu.Lock()
		if n.in != in {
			n.mu.Unlock()
			return // closed: no store listens any more
		}
		if err != nil { // every watch is gone: wake everyone; the next Watch opens another
			for wd, subs := range in.subs {
				for w := range subs {
					to = append(to, heard{w, wd, unix.IN_IGNORED})
				}
			}
			n.close(in)
			n.mu.Unlock()
			for _, h := range to {
				h.w.heard(in, h.wd, h.mask)
			}
			return
		}
		clear(masks)
		if masks == nil {
			masks = make(map[int32]uint32)
		}
		var overflow uint32
		for off := 0; off+unix.SizeofInotifyEvent <= nr; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			if mask&unix.IN_Q_OVERFLOW != 0 {
				overflow = unix.IN_Q_OVERFLOW // wd -1: events of any watch were dropped
			} else {
				masks[wd] |= mask
			}
			off += unix.SizeofInotifyEvent + size
		}
		if overflow != 0 {
			for wd := range in.subs {
				masks[wd] |= overflow
			}
		}
		for wd, mask := range masks {
			for w := range in.subs[wd] {
				to = append(to, heard{w, wd, mask})
			}
			if mask&unix.IN_IGNORED != 0 { // removed (descriptors are not reused at once)
				delete(in.subs, wd)
			}
		}
		if len(in.subs) == 0 {
			n.close(in)
		}
		n.mu.Unlock()
		for _, h := range to {
			h.w.heard(in, h.wd, h.mask)
		}
	}
}
