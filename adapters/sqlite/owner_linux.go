//go:build linux

package sqlite

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks/domain"
)

// ownerClaim is a store's claim of its owner id (Options.Owner): an OFD
// write lock on one byte of the wake file, far past everything else in it,
// picked by 62 bits of the id's SHA-256, so that two different ids meet
// on one byte once in 2^62 pairs. The kernel drops it when its descriptor
// closes: at Close, or at the process's end however it ends, so a dead
// process leaves nothing to clean. The descriptor is the claim's own, not
// the wake file's (which is opened again when the file is replaced): an
// OFD lock belongs to its open file description, so two stores of one
// process exclude each other as two processes do.
type ownerClaim struct{ f *os.File }

// ownerClaimsAt is where the claims' bytes begin: 2^62 bytes of them up to
// the largest offset a lock may have, none shared with the wake file's own.
const ownerClaimsAt = 1 << 62

// ownerByte is the byte of the wake file whose lock claims owner.
func ownerByte(owner string) int64 {
	sum := sha256.Sum256([]byte(owner))
	return ownerClaimsAt | int64(binary.BigEndian.Uint64(sum[:8])>>2)
}

// claimOwner claims owner on the database db (resolved by sidePath), or
// returns a *domain.OwnerInUseError when another open store claims it. It
// claims nothing (nil, nil) for an empty owner, and where it cannot: the
// wake file is another user's and read-only to this one, or the kernel has
// no OFD locks (before Linux 3.15).
func claimOwner(db, owner string) (*ownerClaim, error) {
	if owner == "" {
		return nil, nil
	}
	fi, err := os.Stat(db)
	if err != nil {
		return nil, err
	}
	w := &wakeFile{db: db, path: db + "-wake"}
	f, writable, err := w.open(fi.Mode().Perm())
	if err != nil {
		if refusedSideFile(err) {
			return nil, err
		}
		return nil, nil // waiters poll here too: the wake file cannot be opened
	}
	if !writable {
		f.Close()
		return nil, nil
	}
	at := ownerByte(owner)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: at, Len: 1}
	switch err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); {
	case err == nil:
		return &ownerClaim{f: f}, nil
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
		f.Close()
		return nil, &domain.OwnerInUseError{Owner: owner, Database: db,
			Where: fmt.Sprintf("its claim is a kernel lock (OFD) on byte %d of %s, held while that container is open", at, w.path)}
	case errors.Is(err, unix.EINVAL):
		f.Close()
		return nil, nil
	default:
		f.Close()
		return nil, fmt.Errorf("claiming owner id %q with a kernel lock on %s: %w", owner, w.path, err)
	}
}

// close frees the claim: the kernel drops the lock with the descriptor.
func (c *ownerClaim) close() error {
	if c == nil {
		return nil
	}
	return c.f.Close()
}
