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
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// wakeFile carries wake-ups between the processes that share a database
// file, through a side file, "<database>-wake" (see docs/architecture.md,
// "Hand-over between processes"):
//
//   - A release writes a new random value into its resource's slot of the
//     file, after its commit: one pwrite of 8 bytes, if anyone watches it.
//   - A waiting process watches the file with inotify, so the kernel wakes
//     it when anyone writes there (no polling, no cost while nothing is
//     released), and re-reads the slots of the resources it waits for.
//     Resources share wakeSlots slots: a release of another resource of
//     the same slot only makes a waiter look once for nothing.
//   - A waiting process holds an open-file-description (OFD) read lock on
//     its slot's byte of a second range of the file, so that a releasing
//     process can ask the kernel whether anyone waits for a resource
//     (Contended), and let that process go first. OFD locks belong to the
//     open file, not to the process, so that no close of another
//     descriptor drops them, and the kernel lets go of them when the
//     process dies.
//   - Each watching store also counts itself in its slot's count, in a
//     page of the file that every process maps, so that a release where
//     nobody waits makes no system call: it reads a zero there.
//
// The database file itself is never opened: the wake file is a file of
// its own, like the writers' "-lock" file.
type wakeFile struct {
	f        *os.File
	db       string // the database, as sidePath resolved it
	path     string // db + "-wake"
	writable bool   // false: this process may watch but not write (another user's file)
	dev, ino uint64 // which file f is
	counts   []byte // the mapped page of watch counts; nil: unknown, as if someone watched
	checked  time.Time

	mu sync.Mutex
	// in and wd are the process's inotify instance and this file's watch
	// there (see inotifier), while any watch of this store is on and one
	// could be had; nil and 0 otherwise.
	in       *inotifyInstance
	wd       int32
	last     [wakeSlots + 1]uint64
	subs     [wakeSlots + 1]map[*wakeSub]struct{}
	watchers [wakeSlots + 1]int // watches per slot: the OFD lock is held while > 0
	watching int                // watches in all
	closed   bool
}

// haveWakeFile: Open opens the wake file here.
const haveWakeFile = true

type wakeSub struct{ c chan struct{} }

const (
	// wakeSlots is how many slots the resources are hashed to; slot 0,
	// past them, is "every resource" (a release of all an owner's locks).
	wakeSlots = 256
	// wakeWaitersAt is where the waiters' lock bytes begin, one per slot,
	// past the slots' values (locks may lie past the end of a file).
	wakeWaitersAt = 1 << 20
	// wakeCountsAt is the page of the watch counts, a uint32 per slot;
	// slot 0's, which nobody watches, is set when the file was replaced.
	wakeCountsAt = 4096
)

// openWakeFile opens (creating it beside the database, with the database
// file's permissions) the wake file of the database at path, a name
// resolved by sidePath. It returns nil, and no error, where it cannot:
// wake-ups are an optimisation, and waiters then poll. It refuses (a
// *SideFileError) a wake file it must not use (see openSideFile), which
// another user may have planted for the store to write through.
func openWakeFile(path string) (*wakeFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil
	}
	w := &wakeFile{db: path, path: path + "-wake"}
	if w.f, w.writable, err = w.open(fi.Mode().Perm()); err != nil {
		if sfe := (*SideFileError)(nil); errors.As(err, &sfe) {
			return nil, err
		}
		return nil, nil
	}
	w.identify()
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
}

func (w *wakeFile) count(slot int) *uint32 { return (*uint32)(unsafe.Pointer(&w.counts[4*slot])) }

// watched reports whether any store of any process may watch slot (0:
// any slot), with w.mu held. The read is a full barrier (an add), which
// orders it after the release's commit: a watcher counted after it
// looks at the store after the commit.
func (w *wakeFile) watched(slot int) bool {
	if w.counts == nil {
		return true
	}
	for s := max(slot, 1); s <= wakeSlots && (s == slot || slot == 0); s++ {
		if atomic.AddUint32(w.count(s), 0) > 0 {
			return true
		}
	}
	return false
}

// recheck is refresh where nobody may wait, which makes no system call:
// once a second, or at once if a process that found the file replaced
// said so here. Until then a replaced file only delays the hand-over to
// waiters on the new one, and their fallback reads bound that anyway.
func (w *wakeFile) recheck() {
	if now := time.Now(); w.counts == nil || atomic.LoadUint32(w.count(0)) != 0 || now.Sub(w.checked) >= time.Second {
		w.checked = now
		w.refresh()
	}
}

// open opens the wake file, creating it with perm, or only for reading
// where this user may not write it; never through a symbolic link, never
// blocking (openSideFile).
func (w *wakeFile) open(perm os.FileMode) (f *os.File, writable bool, err error) {
	f, err = openSideFile(w.db, w.path, os.O_RDWR|os.O_CREATE, perm)
	if errors.Is(err, fs.ErrPermission) {
		f, err = openSideFile(w.db, w.path, os.O_RDONLY, 0)
		return f, false, err
	}
	if err == nil {
		// The umask may have taken bits the database has: whoever may
		// write the database must be able to signal its releases. The
		// descriptor's file is the one checked, so this reaches no other.
		_ = f.Chmod(perm)
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

// freed tells the waiting processes that the locks on refs came free (no
// refs: any lock may have).
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

// bump writes a new value into slot. A failure (a full disk) is ignored:
// waiters still find the release on their fallback period.
func (w *wakeFile) bump(slot int) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64()|1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recheck()
	if w.writable && w.watched(slot) {
		_, _ = w.f.WriteAt(b[:], int64(slot)*8)
	}
}

// Contended implements application.Wakeups.
func (w *wakeFile) Contended(ref domain.ResourceRef) bool {
	slot := wakeSlot(ref)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: wakeWaitersAt + int64(slot), Len: 1}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recheck()
	var n, mine uint32
	if w.counts != nil {
		if n, mine = atomic.AddUint32(w.count(slot), 0), uint32(min(w.watchers[slot], 1)); n <= mine {
			return false // only this store watches (its lock is invisible to it)
		}
	}
	if err := unix.FcntlFlock(w.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false
	}
	if lk.Type == unix.F_UNLCK && w.counts != nil {
		// Counted, yet nobody else holds a mark: watchers that died. A
		// watcher locks before it counts and uncounts before it unlocks,
		// so one that came since changed the count, and this fails.
		atomic.CompareAndSwapUint32(w.count(slot), n, mine)
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
		// Nobody waits here: take the watch off, and let the instance go
		// if no other store watches; the next Watch starts over.
		w.stop()
	}
}

// mark takes (on) or lets go of this store's mark that it waits for a
// resource of slot: the lock, then the count, and the other way round
// (see Contended). A lock that fails leaves the waiter uncounted: it
// finds releases on its fallback reads.
func (w *wakeFile) mark(slot int, on bool) {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: wakeWaitersAt + int64(slot), Len: 1}
	switch {
	case on && unix.FcntlFlock(w.f.Fd(), unix.F_OFD_SETLK, &lk) == nil && w.counts != nil:
		atomic.AddUint32(w.count(slot), 1)
	case !on:
		if w.counts != nil {
			atomic.AddUint32(w.count(slot), ^uint32(0))
		}
		lk.Type = unix.F_UNLCK
		_ = unix.FcntlFlock(w.f.Fd(), unix.F_OFD_SETLK, &lk)
	}
}

// wakeEvents are what the watch hears: a write, and a change of the
// file's links (IN_ATTRIB: removed, or replaced by a rename; IN_MOVE_SELF:
// renamed away), after which the file at the path is another one, where
// the releases now go (see refresh).
const wakeEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVE_SELF

// start begins watching the file, with w.mu held, on the process's
// inotify instance. It reads the slots after the watch is on, so no
// release falls between. Where no watch can be had, w.in stays nil and the
// waiters poll.
func (w *wakeFile) start() {
	// Watch the file open here, through its descriptor, not whatever the
	// name leads to by now; without /proc, the name, never followed.
	in, wd, ok := inotify.watch(w, fmt.Sprintf("/proc/self/fd/%d", w.f.Fd()), w.path)
	if !ok {
		return
	}
	w.in, w.wd = in, wd
	w.readSlots()
}

// stop takes this store's watch off, with w.mu held, and returns the
// instance's done channel where that was its last watch (see
// inotifier.unwatch).
func (w *wakeFile) stop() (done <-chan struct{}) {
	done = inotify.unwatch(w.in, w.wd, w)
	w.in, w.wd = nil, 0
	return done
}

// heard handles the events that in reported for the watch wd, which w had
// when they were read: a write, a change of the file's links, the removal
// of the watch, or (IN_Q_OVERFLOW) events lost.
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
		// The file may no longer be the one at the path (or an overflow
		// dropped the news): releases go to the new one, so the watch
		// moves there now.
		w.refresh()
		if w.in != in || w.wd != wd {
			return // refresh moved the watch, and woke everyone
		}
	}
	switch {
	case gone:
		// Nothing will be heard on this watch again (inotify already
		// forgot it): wake everyone, who look at the store, and let the
		// next Watch start over on a file of that name.
		w.in, w.wd = nil, 0
		w.wakeAll()
	case all:
		w.readSlots()
		w.wakeAll()
	default:
		w.wakeChanged()
	}
}

// refresh makes sure, with w.mu held, that the wake file this process
// has open is the one at its path: writing to, marking or watching a
// removed or replaced one reaches no one. It opens the one at the path,
// takes this process's marks there again and moves the watch over, waking
// every watcher (a release may have gone to the new file meanwhile). One
// lstat(2) when nothing changed.
func (w *wakeFile) refresh() {
	var cur unix.Stat_t
	if w.closed {
		return
	}
	if err := unix.Lstat(w.path, &cur); err == nil && cur.Dev == w.dev && cur.Ino == w.ino {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(int(w.f.Fd()), &st) != nil {
		return
	}
	f, writable, err := w.open(os.FileMode(st.Mode).Perm())
	if err != nil {
		// Nothing there that can be made, or something planted there
		// that must not be used: keep the file open here, which reaches
		// no one; waiters find releases on their fallback reads.
		return
	}
	old := w.f
	if w.counts != nil {
		atomic.StoreUint32(w.count(0), 1) // whoever maps it looks at the path now
	}
	w.unmark()
	w.f, w.writable = f, writable
	w.identify()
	for slot, n := range w.watchers {
		if n > 0 {
			w.mark(slot, true)
		}
	}
	old.Close() // another file than the database: closing it drops only our marks there
	if in, wd := w.in, w.wd; in != nil {
		// Watch the new file before the old one's watch goes: were it
		// this process's last, the instance would close and open again.
		w.in, w.wd = nil, 0
		w.start()
		inotify.unwatch(in, wd, w)
		w.wakeAll()
	}
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

// close stops the watch and closes the file, which lets go of this
// process's marks.
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
	if w.counts == nil {
		return
	}
	for slot, n := range w.watchers {
		if n > 0 {
			atomic.AddUint32(w.count(slot), ^uint32(0))
		}
	}
	_ = unix.Munmap(w.counts)
	w.counts = nil
}

// inotify is the process's one inotify instance, which every store's
// watches share: a user may have only a few (max_user_instances, 128 by
// default), and one per store would take them from the user's other
// programs. It opens with the first watch and closes after the last.
var inotify inotifier

// inotifyInit is inotify_init1(2); tests make it fail as it does where the
// user's instances are all taken.
var inotifyInit = unix.InotifyInit1

// inotifier keeps the process's inotify instance and who listens to each
// of its watches.
//
// The lock order is wakeFile.mu, then inotifier.mu: a store watches and
// unwatches with its own lock held, so the reader never holds this one
// while it hands events to a store.
type inotifier struct {
	mu sync.Mutex
	in *inotifyInstance // nil: no watch is on
}

// inotifyInstance is one inotify instance and its reader. Watch
// descriptors are the instance's: a stale one, read from an instance
// that has closed since, must not reach a store watching on the next.
type inotifyInstance struct {
	f  *os.File // non-blocking: reads wait in the runtime's poller
	fd int
	// subs lists, for each watch, the stores that listen to it. inotify
	// gives one watch per file per instance, and the same descriptor to
	// every inotify_add_watch of one file: the stores of this process on
	// one database (several containers, a probe beside a service) share
	// it, and each must hear its events. The watch is removed when its
	// last store stops listening.
	subs map[int32]map[*wakeFile]struct{}
	done chan struct{} // closed when the reader has ended
}

// watch adds a watch on w's wake file, through fdPath (its descriptor
// under /proc), or, without /proc, through path, never followed; it opens
// the instance if none is open. ok is false where neither can be had
// (the user's instances or watches are all taken): the waiters poll.
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
	// Every watch asks for the same events; IN_MASK_ADD all the same, so
	// that a second store on a file never takes events from the first.
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
	const events = wakeEvents | unix.IN_MASK_ADD
	wd, err := unix.InotifyAddWatch(fd, fdPath, events)
	if err != nil {
		wd, err = unix.InotifyAddWatch(fd, path, events|unix.IN_DONT_FOLLOW)
	}
	return int32(wd), err
}

// unwatch stops w listening to the watch wd of in, removes the watch if
// no store listens to it any more, and closes the instance if it has no
// watch left; it then returns the instance's done channel, which closes
// when its reader has ended (the reader may be waiting for a store's
// lock: only a caller that holds none may wait for it).
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

// close closes in, the current instance, with n.mu held: its reader then
// ends, touching no store.
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

// read reads in's events until it closes, and hands each to the stores
// that listen to its watch.
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
		if err != nil {
			// The instance failed: every store's watch is gone with it.
			// Wake everyone, who look at the store; the next Watch opens
			// another instance.
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
			if mask&unix.IN_IGNORED != 0 {
				// inotify removed the watch (its file is gone), or this
				// is the news of an inotify_rm_watch, whose watch was
				// forgotten here already: descriptors are not reused at
				// once, so that none of a later watch is taken for it.
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
