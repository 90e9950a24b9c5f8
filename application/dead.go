package application

import (
	"context"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Processes tells whether a process of this machine is gone. It is asked
// only about owners that name a process (domain.ProcessOwner).
type Processes interface {
	// Gone reports whether the process p names is provably gone: it was a
	// process of this machine (same host, boot and pid namespace), no
	// process with its pid and start time runs now, and, if p names a
	// process group, the group has no member left. It reports false
	// whenever it cannot be sure: another machine, another container, a
	// stopped process (it may be continued), a process it may not see, an
	// error reading its state.
	Gone(p domain.ProcessOwner) bool
}

// WithProcesses lets Acquire take over, at once, an active lock whose
// holder is a process of this machine that is gone, instead of refusing
// until the lock expires (nil: never).
func WithProcesses(p Processes) Option { return func(s *LockService) { s.processes = p } }

// takeOverDead takes the lock on ref for owner if holder, whose active lock
// refused it, is a process that is gone. The liveness probe runs outside
// the write; the write then decides by decide, the rule of the call
// (Acquire's or Take's), on the row as overDead has it.
func (s *LockService) takeOverDead(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	holder domain.Lock, decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error)) (domain.Lock, bool, error) {
	if s.processes == nil {
		return domain.Lock{}, false, nil
	}
	p, ok := domain.ParseProcessOwner(holder.Owner)
	if !ok || holder.Owner == owner || !s.processes.Gone(p) {
		return domain.Lock{}, false, nil
	}
	tookOver := false
	out, err := s.apply(ctx, owner, ref, ttl, func(cur *domain.Lock, now, expires time.Time) (Change, error) {
		cur, tookOver = overDead(holder, cur, now)
		return decide(cur, owner, ref, now, expires)
	}, nil)
	// A decision that matched the dead holder but wrote nothing (refused
	// at a wait's deadline, or failed) took nothing over.
	return out.Lock, tookOver && (err == nil || out.Lock.Token != 0), err
}
