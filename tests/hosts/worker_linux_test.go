//go:build linux

package hosts

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The worker: one client host, run as the test binary re-executed inside
// the host's namespaces with envWorker set. It reads commands on stdin
// ("clock <offset>", "stop"; EOF stops it too, so a harness that dies takes
// its hosts with it) and writes its history as JSON lines on stdout.
const (
	envWorker = "LOCKS_HOSTS_WORKER"
	envDSN    = "LOCKS_HOSTS_DSN"
	envHost   = "LOCKS_HOSTS_HOST"
	envOwner  = "LOCKS_HOSTS_OWNER"
)

// ttl is the locks' TTL: the shortest the module accepts, so that faults
// past it stay short.
const ttl = domain.MinLockTTL

var (
	plans   = []string{"p1", "p2", "p3"}
	logRefs = []domain.ResourceRef{{Type: domain.ResourceProject, ID: "log1"}, {Type: domain.ResourceProject, ID: "log2"}}
)

// offsetClock is the host's wall clock: the real one plus an offset that
// the harness steps. It has no timers and no monotonic reading of its own,
// as a production clock: the service measures elapsed time on the host's
// monotonic clock (docs/operations.md), so a step must change no decision.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// serverClock is the container's clock on PostgreSQL
// (postgres.ServerClock): its estimate of the server's time.
type serverClock interface {
	Now() time.Time
	Offset() (offset, uncertainty time.Duration, err error)
}

// recorder writes the history, and is the service's Observer.
type recorder struct {
	host, owner string
	clock       atomic.Value // the container's serverClock, once open
	mu          sync.Mutex
	enc         *json.Encoder
	held        map[string]int64 // resource → token of this process's current lock
	seq         atomic.Int64
}

func (r *recorder) emit(e Event) {
	e.Host, e.Owner = r.host, r.owner
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if clk, ok := r.clock.Load().(serverClock); ok {
		// The estimate between two readings of the real time, and the
		// larger of the uncertainties around it, in case a measurement
		// came in between.
		_, before, _ := clk.Offset()
		from := time.Now()
		est := clk.Now()
		to := time.Now()
		_, after, _ := clk.Offset()
		e.Estimate, e.EstimateFrom, e.EstimateTo = est, from, to
		e.Skew, e.Uncertainty = est.Sub(e.At), max(before, after)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(e)
}

// Observe implements application.Observer: acquisitions, renewals and
// releases of this process's locks, stamped when the service reports them
// (after the commit).
func (r *recorder) Observe(_ context.Context, e application.Event) {
	res := e.Resource.String()
	switch e.Kind {
	case application.EventAcquired, application.EventTakenOver:
		r.mu.Lock()
		r.held[res] = e.Lock.Token
		r.mu.Unlock()
		r.emit(Event{Kind: KindAcquired, Resource: res, Token: e.Lock.Token, Expires: e.Lock.ExpiresAt,
			Stored: e.Lock.AcquiredAt, DeadHolder: e.DeadHolder})
	case application.EventRenewed:
		r.emit(Event{Kind: KindRenewed, Resource: res, Token: e.Lock.Token, Expires: e.Lock.ExpiresAt})
	case application.EventReleased:
		if e.Previous != nil { // a handle's release: the token it removed
			r.emit(Event{Kind: KindReleased, Resource: res, Token: e.Previous.Token})
		}
	case application.EventReleasedAll:
		// The container's Close: every lock this process held may be gone.
		r.mu.Lock()
		held := maps.Clone(r.held)
		r.mu.Unlock()
		for res, token := range held {
			r.emit(Event{Kind: KindReleased, Resource: res, Token: token})
		}
	}
}

func (r *recorder) token(res string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[res]
}

// watchLoss records the loss that ends a keep-alive context while the
// work still runs; the returned function marks the work done.
func (r *recorder) watchLoss(ctx context.Context, res string, token int64) (done func()) {
	var finished atomic.Bool
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stop:
			return
		}
		at := time.Now()
		var lost *domain.LockLostError
		if errors.As(context.Cause(ctx), &lost) && !finished.Load() {
			r.emit(Event{Kind: KindLost, Resource: res, Token: token, At: at, Err: lost.Error()})
		}
	}()
	return func() { finished.Store(true); close(stop) }
}

// fencedWrite appends the write's row inside a transaction that checks
// fences first, and records the outcome.
func (r *recorder) fencedWrite(ctx context.Context, c *locks.Container, db *sql.DB, kind, res string, token int64,
	fences []application.Fence, more func(tx *sql.Tx) error) error {
	attempt := fmt.Sprintf("%s-%d", r.owner, r.seq.Add(1))
	if at := time.Now(); ctx.Err() == nil {
		r.emit(Event{Kind: KindBelief, Resource: res, Token: token, At: at})
	}
	// The write runs on a context of its own, not the lock's: a holder
	// that learns of its loss late, or never, still sends it, and only the
	// fence may keep it out.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	ctx = wctx
	outcome, err := Failed, error(nil)
	defer func() {
		e := Event{Kind: KindWrite, Resource: res, Token: token, Outcome: outcome, Attempt: attempt}
		if err != nil {
			e.Err = err.Error()
		}
		r.emit(e)
	}()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	for _, f := range fences {
		if err = c.CheckFence(ctx, tx, f); err != nil {
			_ = tx.Rollback()
			var lost *domain.LockLostError
			if errors.As(err, &lost) {
				outcome = Refused
			}
			return err
		}
	}
	if more != nil {
		if err = more(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	if _, err = tx.ExecContext(ctx, `INSERT INTO writes (kind, resource, token, owner, attempt) VALUES ($1, $2, $3, $4, $5)`,
		kind, res, token, r.owner, attempt); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err = tx.Commit(); err != nil {
		outcome = Unknown
		return err
	}
	outcome = Committed
	return nil
}

// plan is the application's plan: a counter that every transition
// increments, read and written back (a lost update shows).
type plan struct{ Counter int64 }

// planStore is the workload's PlanStore: Persist fences, writes the
// counter and appends the transition's row, in one transaction.
type planStore struct {
	c   *locks.Container
	db  *sql.DB
	rec *recorder
}

func (s *planStore) Load(ctx context.Context, id string) (plan, error) {
	var p plan
	err := s.db.QueryRowContext(ctx, `SELECT counter FROM plans WHERE id = $1`, id).Scan(&p.Counter)
	return p, err
}

func (s *planStore) Persist(ctx context.Context, id string, p plan, fences []application.Fence) error {
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}
	var token int64
	for _, f := range fences {
		if f.Resource == ref {
			token = f.Token
		}
	}
	return s.rec.fencedWrite(ctx, s.c, s.db, "transition", ref.String(), token, fences, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE plans SET counter = $1, token = $2 WHERE id = $3`, p.Counter, token, id)
		return err
	})
}

// work stands for the slow part of a holder's work: up to max, or until
// the lock is lost.
func work(ctx context.Context, max time.Duration) {
	t := time.NewTimer(rand.N(max))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func workerMain() int {
	host, owner, dsn := os.Getenv(envHost), os.Getenv(envOwner), os.Getenv(envDSN)
	rec := &recorder{host: host, owner: owner, enc: json.NewEncoder(os.Stdout), held: map[string]int64{}}
	hn, _ := os.Hostname()
	rec.emit(Event{Kind: KindStarted, Err: fmt.Sprintf("hostname %s pid %d", hn, os.Getpid())})
	clk := &offsetClock{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the harness's commands
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			f := strings.Fields(in.Text())
			switch {
			case len(f) == 2 && f[0] == "clock":
				if d, err := time.ParseDuration(f[1]); err == nil {
					clk.off.Store(int64(d))
					rec.emit(Event{Kind: KindClock, Clock: clk.Now()}) // the step's proof, for the harness
				}
			case len(f) == 1 && f[0] == "stop":
				cancel()
			}
		}
		cancel()
	}()
	var c *locks.Container
	for { // a host may start while its network or the server is down
		var err error
		c, err = locks.Open(ctx, locks.Config{Database: dsn, Owner: owner, Clock: clk, DefaultTTL: ttl, Observer: rec})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0
		}
		fmt.Fprintln(os.Stderr, host, "open:", err)
		work(ctx, time.Second)
	}
	defer c.Close()
	if clk, ok := c.Clock().(serverClock); ok {
		rec.clock.Store(clk)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, host, err)
		return 1
	}
	defer db.Close()
	store := &planStore{c: c, db: db, rec: rec}
	svc, err := application.NewPlanLifecycleService[plan](c.Locks, store, owner,
		application.PlanLockOptions{TTL: ttl, WaitTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, host, err)
		return 1
	}
	var wg sync.WaitGroup
	wg.Go(func() { // transitions of the plans
		for ctx.Err() == nil {
			id := plans[rand.N(len(plans))]
			res := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}.String()
			_, err := svc.Transition(ctx, id, func(ctx context.Context, p plan) (plan, error) {
				defer rec.watchLoss(ctx, res, rec.token(res))()
				work(ctx, 1500*time.Millisecond)
				p.Counter++
				return p, nil
			})
			if err != nil {
				work(ctx, 200*time.Millisecond) // a failing store is not hammered
			}
		}
	})
	// The host's own resource, which only its two goroutines take: after
	// a loss, the sibling takes it next, with the same owner, while a slow
	// section of the other may still be about to write.
	own := domain.ResourceRef{Type: domain.ResourceProject, ID: host}
	doSections := func() { // Do sections appending to a log
		for ctx.Err() == nil {
			ref := own
			if rand.N(3) == 0 {
				ref = logRefs[rand.N(len(logRefs))]
			}
			err := c.Locks.Do(ctx, owner, ref, application.AcquireOptions{TTL: ttl, Wait: true, Timeout: 10 * time.Second},
				func(ctx context.Context, l domain.Lock) error {
					defer rec.watchLoss(ctx, ref.String(), l.Token)()
					// Past the TTL, half the time: renewed. One section in
					// two is slow to hear of a loss, as a call that cannot
					// be interrupted: it writes up to two TTLs after its
					// lock is lost, when the other goroutine of this
					// process may hold it, with the same owner: only the
					// token tells the two apart.
					work(ctx, 2*ttl)
					if ctx.Err() != nil && rand.N(2) == 0 {
						work(context.WithoutCancel(ctx), 2*ttl)
					}

					if ref != own || rand.N(3) != 0 {
						return rec.fencedWrite(ctx, c, db, "do", ref.String(), l.Token,
							[]application.Fence{application.FenceOf(l)}, nil)
					}
					// A log entry under both locks: two fences in one
					// transaction (own, then a log: one order for all).
					log := logRefs[rand.N(len(logRefs))]
					return c.Locks.Do(ctx, owner, log, application.AcquireOptions{TTL: ttl, Wait: true, Timeout: 10 * time.Second},
						func(ctx context.Context, inner domain.Lock) error {
							defer rec.watchLoss(ctx, log.String(), inner.Token)()
							return rec.fencedWrite(ctx, c, db, "do2", log.String(), inner.Token,
								[]application.Fence{application.FenceOf(l), application.FenceOf(inner)}, nil)
						})
				})
			if err != nil {
				work(ctx, 200*time.Millisecond)
			}
		}
	}
	wg.Go(doSections)
	wg.Go(doSections)
	// Every host purges expired locks, often: a purge that decided on a
	// wrong clock would remove live locks under their holders.
	wg.Go(func() {
		for ctx.Err() == nil {
			sleep(ctx, 500*time.Millisecond+rand.N(2500*time.Millisecond))
			if _, err := c.Locks.CleanupExpired(ctx); err != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, host, "cleanup:", err)
			}
		}
	})
	wg.Go(func() { manualHolder(ctx, c, db, rec, host+"-m", true) })
	wg.Go(func() { manualHolder(ctx, c, db, rec, host+"-m", true) })
	wg.Go(func() { manualHolder(ctx, c, db, rec, host+"-s", false) })
	wg.Go(func() { keptHolder(ctx, c, rec, host+"-k", false) })
	wg.Go(func() { keptHolder(ctx, c, rec, host+"-k2", true) })
	wg.Wait()
	return 0
}

// manualHolder takes handles with Wait and no keep-alive, on a resource
// of its process's (which its sibling takes next, with the same owner)
// or on one that every host takes, and holds each in steps of a quarter
// to seven quarters of the TTL, between which it renews or writes: about
// half of its renewals, writes and releases come after the lock expired,
// and its sibling, or a purge, may have taken or removed it meanwhile.
// A third of its claims never write; their "still held" marks alone show
// an overlap. Two per host share id; a third has id to itself, so that
// only a purge competes with its late renewals.
func manualHolder(ctx context.Context, c *locks.Container, db *sql.DB, rec *recorder, id string, share bool) {
	mine := domain.ResourceRef{Type: domain.ResourceProject, ID: id}
	shared := domain.ResourceRef{Type: domain.ResourceProject, ID: "shared"}
	for ctx.Err() == nil {
		ref := mine
		if share && rand.N(3) == 0 {
			ref = shared
		}
		h, err := c.Locks.Take(ctx, rec.owner, ref, application.AcquireOptions{TTL: ttl, Wait: true, Timeout: 10 * time.Second})
		if err != nil {
			work(ctx, 200*time.Millisecond)
			continue
		}
		// A third never write; the others write once (the checker holds
		// a resource's writes to strictly increasing tokens).
		writes := rand.N(3) != 0
		for step := rand.N(4); ; step-- {
			// In time, just late (before a purge or a taker comes, so
			// that a late renewal meets the expired row), or late.
			d := ttl/4 + rand.N(ttl/2)
			switch rand.N(4) {
			case 1, 3:
				d = ttl + 100*time.Millisecond + rand.N(150*time.Millisecond)
			case 2:
				d = ttl + rand.N(3*ttl/4)
			}
			rec.holdFor(ctx, h.Lock(), d)
			if step == 0 || ctx.Err() != nil {
				break
			}
			if writes && rand.N(2) == 0 {
				writes = false
				rec.markHeld(h.Lock())
				_ = rec.fencedWrite(noBelief, c, db, "manual", ref.String(), h.Lock().Token,
					[]application.Fence{application.FenceOf(h.Lock())}, nil)
			} else if _, err := h.Renew(ctx); err != nil {
				break
			}
		}
		_, _ = h.Release(context.WithoutCancel(ctx))
	}
}

// keptHolder holds the lock on id, a resource of its process's, or (if
// share, one time in four) the one every host takes, kept alive for two to
// four TTLs at a time, and never writes: its "still held" marks (while the
// keep-alive's context lives and the host's estimate of the server's time
// says the lock has not expired) and its loss alone show an overlap or a
// loss heard late, under a cut-off that outlasts the TTL. Two per host,
// so that one holds whenever a fault begins.
func keptHolder(ctx context.Context, c *locks.Container, rec *recorder, id string, share bool) {
	mine := domain.ResourceRef{Type: domain.ResourceProject, ID: id}
	shared := domain.ResourceRef{Type: domain.ResourceProject, ID: "shared"}
	for ctx.Err() == nil {
		ref := mine
		if share && rand.N(4) == 0 {
			ref = shared
		}
		h, err := c.Locks.Take(ctx, rec.owner, ref, application.AcquireOptions{TTL: ttl, Wait: true, Timeout: 10 * time.Second})
		if err != nil {
			work(ctx, 200*time.Millisecond)
			continue
		}
		held := h.KeepAlive(ctx)
		done := rec.watchLoss(held, ref.String(), h.Lock().Token)
		// It ends its work only while its estimate says it holds the
		// lock: one whose expiry passed works on until it hears of the
		// loss (as a holder relying on its context does), which the
		// keep-alive owes it at the expiry.
		end := time.Now().Add(2*ttl + rand.N(2*ttl))
		for held.Err() == nil {
			at := time.Now()
			if held.Err() == nil && rec.markHeldAt(h.Lock(), at) && at.After(end) {
				break
			}
			if at.After(end.Add(3 * ttl)) {
				break
			}
			sleep(held, 100*time.Millisecond)
		}
		done()
		_, _ = h.Release(context.WithoutCancel(ctx))
		work(ctx, 200*time.Millisecond)
	}
}

// noBelief is a done context: a write made with it records no "still
// held" mark of its own (a holder without a keep-alive records its marks
// from its lock's expiry, markHeld), and still runs to its end.
var noBelief = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// holdFor holds l for d, recording a "still held" mark every 100 ms while
// the host's estimate of the server's time says l has not expired.
func (r *recorder) holdFor(ctx context.Context, l domain.Lock, d time.Duration) {
	end := time.Now().Add(d)
	for {
		r.markHeld(l)
		left := time.Until(end)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		sleep(ctx, min(left, 100*time.Millisecond))
	}
}

// markHeld records that l is still held, if the host's estimate of the
// server's time, widened by its stated uncertainty, is before l's expiry.
// The mark is dated before the estimate is read, so that a host stopped
// in between records an earlier time than its check, never a later one.
func (r *recorder) markHeld(l domain.Lock) { r.markHeldAt(l, time.Now()) }

// markHeldAt is markHeld for a check that began at at; it reports whether
// it recorded the mark.
func (r *recorder) markHeldAt(l domain.Lock, at time.Time) bool {
	clk, ok := r.clock.Load().(serverClock)
	if !ok {
		return false
	}
	_, unc, _ := clk.Offset()
	if !clk.Now().Add(unc + 20*time.Millisecond).Before(l.ExpiresAt) {
		return false
	}
	r.emit(Event{Kind: KindBelief, Resource: l.Resource.String(), Token: l.Token, At: at})
	return true
}
