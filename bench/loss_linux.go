//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// lossCaseRun is a lossCase with what runs it: the holder process, a
// probe that tells when the holder watches its resource, and the calls
// that end the holding from this process.
type lossCaseRun struct {
	*lossCase
	holder *hoWorker
	owner  string // the holder's
	probe  application.Wakeups
	// end ends the holder's holding of ref and returns CLOCK_MONOTONIC
	// as the call that ended it was made and as it returned; tidy lets
	// the next round's holder take a resource again.
	end func(ctx context.Context, ref domain.ResourceRef) (called, returned int64, tidy func() error, err error)
}

// lossStoreRun is what one store's cases share: the containers that end
// the holdings, and the probe.
type lossStoreRun struct {
	target       string
	taker, ahead *locks.Container
	probe        interface {
		Wakeups() application.Wakeups
		Close() error
	}
}

// aheadClock is an hour ahead of the real clock: its owner finds every
// lock of the others expired and takes it over, as an owner whose holder
// paused past the expiry would; no release precedes the takeover.
type aheadClock struct{}

func (aheadClock) Now() time.Time { return time.Now().Add(time.Hour) }

// runLoss measures the prompt-loss cases that the selected contenders
// call for: module-sqlite on a SQLite file, module-postgres on a schema.
func runLoss(ctx context.Context, env *environment, selected []contender, opts options) (*lossReport, error) {
	l := &lossReport{}
	var runs []*lossCaseRun
	var stores []*lossStoreRun
	defer func() {
		for _, c := range runs {
			if c.holder != nil {
				c.holder.stop()
			}
		}
		for _, s := range stores {
			s.close()
		}
	}()
	for _, st := range []struct {
		contender string
		postgres  bool
	}{{"module-sqlite", false}, {"module-postgres", true}} {
		if !isSelected(selected, st.contender) {
			l.skipped = append(l.skipped, fmt.Sprintf("%s prompt-loss cases skipped: %s is not selected, or its store does not answer",
				strings.TrimPrefix(st.contender, "module-"), st.contender))
			continue
		}
		s, err := openLossStore(ctx, env, st.postgres)
		if s != nil {
			stores = append(stores, s)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st.contender, err)
		}
		for _, how := range []struct{ name, how string }{
			{"removed, then taken", "`Locks.Release` by the holder's owner id, then `Acquire` by another owner; from the release's return"},
			{"taken over", "`Take` by another owner whose clock is an hour ahead, with no release; from the takeover's return"},
		} {
			c := &lossCaseRun{
				lossCase: &lossCase{c: &handoverCase{name: st.contender + ", " + how.name, how: how.how}, store: st.contender, reasons: map[string]int{}},
				owner:    fmt.Sprintf("bench-loss-holder-%d", len(runs)),
				probe:    s.probe.Wakeups(),
			}
			if how.name == "taken over" {
				c.end = s.takeOver
			} else {
				c.end = func(ctx context.Context, ref domain.ResourceRef) (int64, int64, func() error, error) {
					return s.removeAndTake(ctx, c.owner, ref)
				}
			}
			if c.holder, err = startHoWorker(ctx, env, lossMode, s.target, c.owner); err != nil {
				c.c.err = err
				fmt.Fprintf(env.log, "prompt loss, %s: %v\n", c.c.name, err)
			}
			runs = append(runs, c)
			l.cases = append(l.cases, c.lossCase)
		}
	}
	for i := -1; i < opts.handovers; i++ {
		for k := range runs {
			c := runs[(k+max(i, 0))%len(runs)]
			if c.c.err != nil {
				continue
			}
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("loss-%d-%d", (k+max(i, 0))%len(runs), i+1)}
			d, reason, err := c.round(ctx, ref)
			if err != nil {
				c.c.err = err
				fmt.Fprintf(env.log, "prompt loss, %s: %v\n", c.c.name, err)
				continue
			}
			if i >= 0 { // the first is a warm-up
				c.c.latencies = append(c.c.latencies, d)
				c.reasons[reason]++
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for _, c := range runs {
		slices.Sort(c.c.latencies)
	}
	return l, nil
}

// openLossStore creates a store of its own for the prompt-loss cases and
// opens what ends the holdings on it.
func openLossStore(ctx context.Context, env *environment, pg bool) (*lossStoreRun, error) {
	s := &lossStoreRun{target: env.file("loss")}
	var err error
	if pg {
		if s.target, err = newSchema(ctx, env, "loss"); err != nil {
			return nil, err
		}
	}
	if s.taker, err = locks.Open(ctx, locks.Config{Database: s.target, Owner: "bench-loss-taker"}); err != nil {
		return s, err
	}
	if s.ahead, err = locks.Open(ctx, locks.Config{Database: s.target, Owner: "bench-loss-ahead", Clock: aheadClock{}, LocalTime: true}); err != nil {
		return s, err
	}
	if pg {
		s.probe, err = postgres.Open(ctx, s.target, postgres.Options{})
	} else {
		s.probe, err = sqlite.Open(ctx, s.target, sqlite.Options{})
	}
	return s, err
}

func (s *lossStoreRun) close() {
	for _, c := range []*locks.Container{s.taker, s.ahead} {
		if c != nil {
			_ = c.Close()
		}
	}
	if s.probe != nil {
		_ = s.probe.Close()
	}
}

// removeAndTake removes owner's lock on ref, as `agents locks release
// --owner` would, and has another owner acquire it at once.
func (s *lossStoreRun) removeAndTake(ctx context.Context, owner string, ref domain.ResourceRef) (int64, int64, func() error, error) {
	called := monoNow()
	ok, err := s.taker.Locks.Release(ctx, owner, ref)
	returned := monoNow()
	if err == nil && !ok {
		err = errors.New("the removal removed no lock")
	}
	if err == nil {
		_, err = s.taker.Locks.Acquire(ctx, "bench-loss-taker", ref, lossTTL)
	}
	return called, returned, func() error { return released(s.taker.Locks.Release(ctx, "bench-loss-taker", ref)) }, err
}

// takeOver takes ref over with the clock ahead, in one commit.
func (s *lossStoreRun) takeOver(ctx context.Context, ref domain.ResourceRef) (int64, int64, func() error, error) {
	called := monoNow()
	h, err := s.ahead.Locks.Take(ctx, "bench-loss-ahead", ref, application.AcquireOptions{TTL: lossTTL})
	returned := monoNow()
	if err != nil {
		return called, returned, nil, err
	}
	tidy := func() error { return released(h.Release(ctx)) }
	if h.Lock().Owner != "bench-loss-ahead" {
		return called, returned, tidy, fmt.Errorf("the takeover left the lock to %q", h.Lock().Owner)
	}
	return called, returned, tidy, nil
}

// round has the holder hold ref in Do, ends the holding once the holder
// watches ref, and returns how long after that the holder's work ended,
// and the reason it was given.
func (c *lossCaseRun) round(ctx context.Context, ref domain.ResourceRef) (time.Duration, string, error) {
	if err := c.holder.send("hold " + ref.ID); err != nil {
		return 0, "", err
	}
	if _, err := c.holder.expect("holding"); err != nil {
		return 0, "", err
	}
	// An end before the holder's watch is in force is found by the read
	// its watch makes as it starts: a different path, not measured here.
	for deadline := time.Now().Add(10 * time.Second); !c.probe.Contended(ref); {
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("the holder of %s does not watch it after 10 s", ref)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return 0, "", err
		}
	}
	called, returned, tidy, err := c.end(ctx, ref)
	if err != nil {
		return 0, "", err
	}
	ended, reason, err := c.holder.ended()
	if err == nil {
		err = tidy()
	}
	if err != nil {
		return 0, "", err
	}
	if ended < called {
		return 0, "", fmt.Errorf("the holder's work ended %v before its lock was touched (%s)", time.Duration(called-ended), reason)
	}
	return max(0, time.Duration(ended-returned)), reason, nil
}

// ended reads the holder's "ended <CLOCK_MONOTONIC ns> <reason>".
func (w *hoWorker) ended() (int64, string, error) {
	line, err := w.out.ReadString('\n')
	if err != nil {
		return 0, "", fmt.Errorf("worker: expected \"ended\", read %q: %w", line, err)
	}
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "ended" {
		return 0, "", fmt.Errorf("worker: expected \"ended\", read %q", strings.TrimSpace(line))
	}
	t, err := strconv.ParseInt(f[1], 10, 64)
	return t, strings.Join(f[2:], " "), err
}

// lossWorkerMain is the holder: "hold <id>" holds the plan id in Do with
// lossTTL, answers "holding" once its work runs, and "ended <CLOCK_MONOTONIC
// ns> <reason>" once its work's context ended for a loss and Do returned;
// a failure answers "error <why>". It ends at the end of its input.
func lossWorkerMain(stdin io.Reader, stdout io.Writer) int {
	ctx := context.Background()
	owner := os.Getenv(workerIDEnv)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(workerDBEnv), Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "prompt-loss holder:", err)
		return 1
	}
	defer c.Close()
	fmt.Fprintln(stdout, "ready")
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		id, ok := strings.CutPrefix(in.Text(), "hold ")
		if !ok {
			fmt.Fprintf(stdout, "error unknown command %q\n", in.Text())
			continue
		}
		var ended int64
		var reason string
		err := c.Locks.Do(ctx, owner, domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, application.AcquireOptions{TTL: lossTTL},
			func(ctx context.Context, _ domain.Lock) error {
				fmt.Fprintln(stdout, "holding")
				select {
				case <-ctx.Done():
				case <-time.After(lossTTL + time.Minute): // long past the renewal that would find the loss
					return errors.New("the work's context did not end")
				}
				ended = monoNow()
				var lost *domain.LockLostError
				if !errors.As(context.Cause(ctx), &lost) {
					return fmt.Errorf("the work's context ended for another cause: %w", context.Cause(ctx))
				}
				reason = lost.Reason.String()
				return nil
			})
		if lost := (*domain.LockLostError)(nil); err != nil && !errors.As(err, &lost) {
			fmt.Fprintln(stdout, "error do:", oneLine(err.Error()))
			continue
		}
		fmt.Fprintf(stdout, "ended %d %s\n", ended, reason)
	}
	return 0
}
