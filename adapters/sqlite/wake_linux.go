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

	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// wakeFile carries wake-ups between the processes that share a database
// file, through a side file, "<database>-wake" (see docs/architecture.md,
// "Hand-over between processes"):
//
//   - A release writes a new random value into its resource's slot of the
//     file, after its commit: one pwrite of 8 bytes, whoever waits or not.
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
//
// The database file itself is never opened: the wake file is a file of
// its own, like the writers' "-lock" file.
type wakeFile struct {
	f        *os.File
	db       string // the database, as sidePath resolved it
	path     string // db + "-wake"
	writable bool   // false: this process may watch but not write (another user's file)
	dev, ino uint64 // which file f is

	mu sync.Mutex
	// in is the inotify instance, while any watch is on and one could be
	// had: it is closed when the last watch stops, since each user may
	// have only a few (fs.inotify.max_user_instances, 128 by default),
	// and a store that has stopped waiting must not keep one from others.
	in       *os.File
	done     chan struct{}
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

// identify notes which file w.f is, for refresh.
func (w *wakeFile) identify() {
	var st unix.Stat_t
	if unix.Fstat(int(w.f.Fd()), &st) == nil {
		w.dev, w.ino = st.Dev, st.Ino
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
	w.refresh()
	if w.writable {
		_, _ = w.f.WriteAt(b[:], int64(slot)*8)
	}
}

// Contended implements application.Wakeups.
func (w *wakeFile) Contended(ref domain.ResourceRef) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: wakeWaitersAt + int64(wakeSlot(ref)), Len: 1}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refresh()
	if err := unix.FcntlFlock(w.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false
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
		w.lockSlot(slot, unix.F_RDLCK)
	}
	var once sync.Once
	return sub.c, func() { once.Do(func() { w.unwatch(slot, sub) }) }
}

func (w *wakeFile) unwatch(slot int, sub *wakeSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs[slot], sub)
	if w.watchers[slot]--; w.watchers[slot] == 0 && !w.closed {
		w.lockSlot(slot, unix.F_UNLCK)
	}
	if w.watching--; w.watching == 0 && w.in != nil && !w.closed {
		// Nobody waits: give the instance back (its loop ends without
		// touching w); the next Watch starts another.
		in := w.in
		w.in, w.done = nil, nil
		in.Close()
	}
}

// lockSlot takes (F_RDLCK) or lets go of (F_UNLCK) this process's mark
// that it waits for a resource of slot. A failure only hides the waiter
// from Contended.
func (w *wakeFile) lockSlot(slot int, typ int16) {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: wakeWaitersAt + int64(slot), Len: 1}
	_ = unix.FcntlFlock(w.f.Fd(), unix.F_OFD_SETLK, &lk)
}

// wakeEvents are what the watch hears: a write, and a change of the
// file's links (IN_ATTRIB: removed, or replaced by a rename; IN_MOVE_SELF:
// renamed away), after which the file at the path is another one, where
// the releases now go (see refresh).
const wakeEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVE_SELF

// start begins watching the file, with w.mu held. It reads the slots
// after the watch is on: a release written after that is seen by the
// watch.
func (w *wakeFile) start() {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return // EMFILE: the user's inotify instances are all taken
	}
	// Watch the file open here, through its descriptor, not whatever the
	// name leads to by now; without /proc, the name, never followed.
	if _, err := unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", w.f.Fd()), wakeEvents); err != nil {
		if _, err := unix.InotifyAddWatch(fd, w.path, wakeEvents|unix.IN_DONT_FOLLOW); err != nil {
			unix.Close(fd)
			return
		}
	}
	w.readSlots()
	w.in = os.NewFile(uintptr(fd), "inotify "+w.path) // non-blocking: reads wait in the runtime's poller
	w.done = make(chan struct{})
	go w.loop(w.in, w.done)
}

// loop reads the watch's events until the file closes, and after each
// wakes the watchers whose slots changed.
func (w *wakeFile) loop(in *os.File, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 64*unix.SizeofInotifyEvent)
	for {
		n, err := in.Read(buf)
		if err != nil {
			w.mu.Lock()
			if !w.closed && w.in == in {
				// The instance failed: wake everyone, who look at the
				// store, and let the next Watch start another one.
				w.in, w.done = nil, nil
				w.wakeAll()
				in.Close()
			}
			w.mu.Unlock()
			return // closed, or replaced by refresh
		}
		all, gone, moved := false, false, false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			all = all || mask&unix.IN_Q_OVERFLOW != 0                     // events were dropped
			gone = gone || mask&unix.IN_IGNORED != 0                      // the watch was removed
			moved = moved || mask&(unix.IN_ATTRIB|unix.IN_MOVE_SELF) != 0 // its links changed
			off += unix.SizeofInotifyEvent + size
		}
		w.mu.Lock()
		if w.closed || w.in != in {
			w.mu.Unlock()
			return // closed, or replaced
		}
		if (moved || all) && !gone {
			// The file may no longer be the one at the path (removed,
			// replaced; or an overflow may have dropped the news): the
			// releases then go to the new one, so the watch moves there
			// at once, rather than at this process's next release or
			// wait, or never.
			w.refresh()
			if w.in != in {
				w.mu.Unlock()
				return // refresh started another watch, and woke everyone
			}
		}
		switch {
		case gone:
			// Nothing will be heard on this instance again: wake
			// everyone, who look at the store, and let the next Watch
			// start over on a file of that name.
			w.in, w.done = nil, nil
			w.wakeAll()
			in.Close()
			w.mu.Unlock()
			return
		case all:
			w.readSlots()
			w.wakeAll()
		default:
			w.wakeChanged()
		}
		w.mu.Unlock()
	}
}

// refresh makes sure, with w.mu held, that the wake file this process
// has open is the one at its path. Someone may have removed or replaced
// it, and another process created a new one since: writing to, marking
// or watching the removed one would then reach no one. So it opens the
// one at the path (creating it), takes this process's marks there again,
// and moves the watch over, waking every watcher (a release may have gone
// to the new file meanwhile). A watching process hears the change of
// links (loop) and calls this at once; every release, watch and
// Contended call it too. One lstat(2) when nothing changed.
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
	w.f, w.writable = f, writable
	w.identify()
	for slot, n := range w.watchers {
		if n > 0 {
			w.lockSlot(slot, unix.F_RDLCK)
		}
	}
	old.Close() // another file than the database: closing it drops only our marks there
	if in := w.in; in != nil {
		w.in, w.done = nil, nil
		in.Close() // its loop ends without touching w
		w.start()
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
	w.closed = true
	in, done := w.in, w.done
	w.mu.Unlock()
	if in != nil {
		in.Close()
		<-done
	}
	return w.f.Close()
}
