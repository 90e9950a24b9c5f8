//go:build linux

package sqlite

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The queue of the waiters of every process on one database lives in the
// wake file, beside the wake-ups (docs/locks.md, "Order of waiters"): a
// place is a number from a word of the mapped page, which every process
// increments, and an OFD read lock on one byte of the file that stands
// for the resource and the number. The kernel drops the lock with the
// descriptor, at Close or when the process dies however it dies, so a
// dead waiter is never ahead of anyone. A waiter is ahead of another when
// it holds a byte of the same resource with an earlier number; finding one
// is one fcntl(2), never a read of the database.
const (
	// queueAt is where the places' bytes begin: 2^61 bytes below the
	// owner claims', 29 bits of the resource's hash then 32 of the number.
	queueAt = 1 << 61
	// queueNumberWord is the word of the counts page that numbers places.
	queueNumberWord = 1022
	// queueWindow is how far back a number counts as earlier (serial
	// number arithmetic, RFC 1982): numbers wrap after 2^32 places.
	queueWindow = 1<<31 - 1
)

// errNoQueue: this store cannot take a place (a wake file it may not
// write, or whose page is not mapped); its waiters go on without the order.
var errNoQueue = errors.New("sqlite: no place in the queue of waiters: the wake file cannot be written here")

var _ application.Queue = (*wakeFile)(nil)

// queuePlace is a place of this store's waiter, on w.f with w.mu held
// for every change: the lock moves with the file when refresh replaces it.
type queuePlace struct {
	w      *wakeFile
	ref    domain.ResourceRef
	base   int64 // queueAt | the resource's 29 bits << 32
	number uint32
	once   sync.Once
}

// queueBase is where the bytes of ref's places begin. Two resources whose
// 29 bits meet share one queue: their waiters wait for each other's turn.
func queueBase(ref domain.ResourceRef) int64 {
	h := fnv.New64a()
	h.Write([]byte(ref.Type))
	h.Write([]byte{1})
	h.Write([]byte(ref.ID))
	return queueAt | int64(h.Sum64()>>35)<<32
}

// Join implements application.Queue.
func (w *wakeFile) Join(_ context.Context, ref domain.ResourceRef) (application.Place, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || !w.writable {
		return nil, false, errNoQueue
	}
	w.recheck()
	n, ok := w.add(queueNumberWord, 1)
	if !ok {
		return nil, false, errNoQueue
	}
	p := &queuePlace{w: w, ref: ref, base: queueBase(ref), number: n}
	if err := p.lock(unix.F_RDLCK); err != nil {
		return nil, false, err
	}
	if w.places == nil {
		w.places = make(map[*queuePlace]struct{})
	}
	w.places[p] = struct{}{}
	return p, p.ahead(), nil
}

// lock sets (F_RDLCK) or clears (F_UNLCK) p's byte on w.f, with w.mu held.
func (p *queuePlace) lock(typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: p.base + int64(p.number), Len: 1}
	return unix.FcntlFlock(p.w.f.Fd(), unix.F_OFD_SETLK, &lk)
}

// ahead reports whether another store holds a place of p's resource with
// an earlier number, with w.mu held. This store's own places never
// conflict with its probe: the service orders them.
func (p *queuePlace) ahead() bool {
	for _, s := range p.earlier() {
		if s[1] == 0 {
			continue
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: p.base + s[0], Len: s[1]}
		if err := unix.FcntlFlock(p.w.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
			return false // cannot tell: on without the order
		}
		if lk.Type != unix.F_UNLCK {
			return true
		}
	}
	return false
}

// earlier returns the spans (start, length) of the numbers before p's.
func (p *queuePlace) earlier() [][2]int64 {
	lo := p.number - queueWindow        // the earliest number that counts as earlier
	if uint64(lo)+queueWindow > 1<<32 { // wraps: two spans
		return [][2]int64{{int64(lo), 1<<32 - int64(lo)}, {0, int64(p.number)}}
	}
	return [][2]int64{{int64(lo), queueWindow}}
}

// Ahead implements application.Place.
func (p *queuePlace) Ahead(context.Context) (int, error) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if p.w.closed {
		return 0, domain.ErrClosed
	}
	p.w.recheck()
	n := 0
	for _, s := range p.earlier() {
		n += p.count(s[0], s[0]+s[1])
	}
	return n, nil
}

// count counts the places held by other stores in [from, to) of p's
// numbers, with w.mu held: F_OFD_GETLK names one lock that conflicts (a
// store's places on adjacent numbers merge into one), then each side of
// it is asked again. A place is one byte, so its lock's length counts them.
func (p *queuePlace) count(from, to int64) int {
	if from >= to {
		return 0
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: p.base + from, Len: to - from}
	if err := unix.FcntlFlock(p.w.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil || lk.Type == unix.F_UNLCK {
		return 0 // none, or cannot tell: on without the order
	}
	lo, hi := max(lk.Start-p.base, from), to
	if lk.Len > 0 {
		hi = min(lk.Start-p.base+lk.Len, to)
	}
	if lo >= hi { // not within [from, to): cannot tell
		return 0
	}
	return int(hi-lo) + p.count(from, lo) + p.count(hi, to)
}

// Leave implements application.Place: a waiter that leaves without the
// lock wakes those of its resource, since the lock may be free.
func (p *queuePlace) Leave(took bool) {
	p.once.Do(func() {
		p.w.mu.Lock()
		delete(p.w.places, p)
		if !p.w.closed {
			_ = p.lock(unix.F_UNLCK)
		}
		p.w.mu.Unlock()
		if !took {
			p.w.bump(wakeSlot(p.ref))
		}
	})
}
