//go:build !linux

package sqlite

// ownerClaim would claim a store's owner id: this system has no
// open-file-description locks (see owner_linux.go), whose claims two
// stores of one process see as two processes' and the kernel drops at the
// process's end, so no owner id is claimed and Open refuses none.
type ownerClaim struct{}

func claimOwner(string, string) (*ownerClaim, error) { return nil, nil }

func (*ownerClaim) close() error { return nil }
