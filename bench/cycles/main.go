// Command cycles runs the acquire+release cycle of one build of the lock
// module and of its hand-written database/sql floor, on SQLite files of
// its own, so that the bench can compare two builds in one run (see
// -builds in the bench's -h; it compiles this command once per build).
// It only uses the module's API that every build since c57c013 has.
//
// With -n it runs n cycles of one contender, shared by -callers, and exits (for strace and
// profiles: run it with n and 2n and subtract); otherwise it reads
// "<module|floor> <duration>" lines on stdin and answers each with the
// cycles per second of a round of that length.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

const ttl = 5 * time.Minute

type cycleFunc func(ctx context.Context, owner, id string) error

func main() {
	dir := flag.String("dir", "", "directory for the SQLite files (default: a new temporary one)")
	callers := flag.Int("callers", 1, "callers cycling at once, each on its own resource")
	n := flag.Int("n", 0, "run this many cycles of -contender and exit")
	contender := flag.String("contender", "module", "module or floor, with -n")
	cpu := flag.String("cpuprofile", "", "write a CPU profile of the -n cycles here")
	flag.Parse()
	if err := run(*dir, *callers, *n, *contender, *cpu); err != nil {
		fmt.Fprintln(os.Stderr, "cycles:", err)
		os.Exit(1)
	}
}

func run(dir string, callers, n int, contender, cpu string) error {
	ctx := context.Background()
	if dir == "" {
		d, err := os.MkdirTemp("", "locks-cycles-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	module, closeModule, err := openModule(ctx, filepath.Join(dir, "module.db"))
	if err != nil {
		return err
	}
	defer closeModule()
	floor, closeFloor, err := openFloor(ctx, filepath.Join(dir, "floor.db"))
	if err != nil {
		return err
	}
	defer closeFloor()
	cycles := map[string]cycleFunc{"module": module, "floor": floor}
	if n > 0 {
		cycle, ok := cycles[contender]
		if !ok {
			return fmt.Errorf("no contender %q", contender)
		}
		if cpu != "" {
			f, err := os.Create(cpu)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		var wg sync.WaitGroup
		errs := make([]error, callers)
		for c := range callers {
			wg.Go(func() {
				for i := c; i < n && errs[c] == nil; i += callers {
					errs[c] = cycle(ctx, fmt.Sprintf("owner-%d", c), fmt.Sprintf("c%d-r%d", c, i%64))
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var name string
		var d time.Duration
		if f := strings.Fields(in.Text()); len(f) == 2 {
			name = f[0]
			d, _ = time.ParseDuration(f[1])
		}
		cycle, ok := cycles[name]
		if !ok || d <= 0 {
			return fmt.Errorf("want \"<module|floor> <duration>\", not %q", in.Text())
		}
		rate, err := round(ctx, cycle, callers, d)
		if err != nil {
			return err
		}
		fmt.Printf("%.1f\n", rate)
	}
	return in.Err()
}

// round runs callers callers, each on resources of its own, for d, and
// returns the cycles per second.
func round(ctx context.Context, cycle cycleFunc, callers int, d time.Duration) (float64, error) {
	var (
		stop  atomic.Bool
		done  atomic.Int64
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			owner := fmt.Sprintf("owner-%d", c)
			for i := 0; !stop.Load(); i++ {
				if err := cycle(ctx, owner, fmt.Sprintf("c%d-r%d", c, i%64)); err != nil {
					first.CompareAndSwap(nil, &err)
					stop.Store(true)
					return
				}
				done.Add(1)
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	if err := first.Load(); err != nil {
		return 0, *err
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

func openModule(ctx context.Context, path string) (cycleFunc, func(), error) {
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "cycles"})
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, owner, id string) error {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}
		if _, err := c.Locks.Acquire(ctx, owner, ref, ttl); err != nil {
			return err
		}
		ok, err := c.Locks.Release(ctx, owner, ref)
		if err == nil && !ok {
			err = errors.New("the release removed no lock")
		}
		return err
	}, func() { c.Close() }, nil
}

// The floor's statements are the module's (see ../floor_sqlite.go).
const (
	floorSelect = "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?"
	floorInsert = "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?) RETURNING `id`"
	floorDelete = "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `owner_id` = ?"
	timeLayout  = "2006-01-02T15:04:05.000000Z"
)

// openFloor opens the hand-written floor of ../floor_sqlite.go on path,
// with the schema the module makes.
func openFloor(ctx context.Context, path string) (cycleFunc, func(), error) {
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "cycles-setup"})
	if err != nil {
		return nil, nil, err
	}
	c.Close()
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+
		"?_busy_timeout=5000&_journal_mode=WAL&_synchronous=NORMAL&_txlock=immediate")
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	var sel, ins, del *sql.Stmt
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{{&sel, floorSelect}, {&ins, floorInsert}, {&del, floorDelete}} {
		if *p.stmt, err = db.PrepareContext(ctx, p.query); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	return func(ctx context.Context, owner, id string) error {
		now := time.Now().UTC().Truncate(time.Microsecond)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		err = tx.Stmt(sel).QueryRowContext(ctx, "plan", id).
			Scan(new(int64), new(string), new(string), new(string), new(string), new(string))
		if !errors.Is(err, sql.ErrNoRows) {
			tx.Rollback()
			return fmt.Errorf("floor: %s is held (%v)", id, err)
		}
		if err := tx.Stmt(ins).QueryRowContext(ctx, owner, "plan", id,
			now.Format(timeLayout), now.Add(ttl).Format(timeLayout)).Scan(new(int64)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		res, err := del.ExecContext(ctx, "plan", id, owner)
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || k != 1 {
			return fmt.Errorf("floor release: %d rows, %v", k, err)
		}
		return nil
	}, func() { db.Close() }, nil
}
