package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// cycleFunc is one caller's acquire+release cycle: on a resource of its
// own, or on the resource all callers share, waiting for it as the
// contender is meant to wait.
type cycleFunc func(ctx context.Context) error

// instance is a contender opened for one scenario: a fresh database file,
// schema or key space of its own.
type instance interface {
	// callers returns n callers, each its own owner, cycling resources of
	// their own, or all the one shared resource when shared.
	callers(ctx context.Context, n int, shared bool) ([]cycleFunc, error)
	close() error
}

// contender is a lock implementation under test.
type contender struct {
	name   string
	server string // "postgres", "redis", or "" for a SQLite file
	open   func(ctx context.Context, env *environment) (instance, error)
}

// contenders are all the implementations, in the order of the tables.
var contenders = []contender{
	{name: "module-sqlite", open: openModuleSQLite},
	{name: "floor-sqlite", open: openFloorSQLite},
	{name: "module-postgres", server: "postgres", open: openModulePostgres},
	{name: "floor-postgres", server: "postgres", open: openFloorPostgres},
	{name: "redislock", server: "redis", open: openRedislock},
	{name: "pg-advisory", server: "postgres", open: openAdvisory},
}

func contenderNames() []string {
	names := make([]string, len(contenders))
	for i, c := range contenders {
		names[i] = c.name
	}
	return names
}

// ownResources is how many resources each caller cycles through: its
// own, so that callers never conflict and a cycle never waits for
// another caller's lock, only for the store.
const ownResources = 4

// lockTTL is the TTL of every lock taken: the module's default.
const lockTTL = 5 * time.Minute

// errBusy is a floor's refusal: the resource is held.
var errBusy = errors.New("the resource is held")

// environment is what the contenders share: a scratch directory, the
// servers' addresses, and the PostgreSQL schemas to drop at the end.
type environment struct {
	dir         string
	postgresDSN string
	redisAddr   string
	log         io.Writer

	mu      sync.Mutex
	files   int
	schemas []string
	skipped []string // why a contender did not run
}

// file returns a new database path in the scratch directory.
func (e *environment) file(prefix string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.files++
	return filepath.Join(e.dir, fmt.Sprintf("%s-%d.db", prefix, e.files))
}

// close drops the PostgreSQL schemas the run created.
func (e *environment) close() {
	if len(e.schemas) > 0 {
		if err := dropSchemas(e.postgresDSN, e.schemas); err != nil {
			fmt.Fprintf(e.log, "dropping the benchmark's PostgreSQL schemas %s: %v\n", strings.Join(e.schemas, ", "), err)
		}
	}
}

// selectContenders returns the contenders that names select (all when
// empty) whose server answers; the others are skipped with a message.
func selectContenders(ctx context.Context, env *environment, names []string) ([]contender, error) {
	for _, n := range names {
		if !isContender(strings.TrimSpace(n)) {
			return nil, fmt.Errorf("no contender is called %q; choose among %s", n, strings.Join(contenderNames(), ", "))
		}
	}
	reach := map[string]error{}
	var out []contender
	for _, c := range contenders {
		if !wants(names, c.name) {
			continue
		}
		if c.server != "" {
			err, probed := reach[c.server]
			if !probed {
				err = probe(ctx, env, c.server)
				reach[c.server] = err
			}
			if err != nil {
				msg := fmt.Sprintf("%s skipped: %s unreachable (%v)", c.name, c.server, err)
				fmt.Fprintln(env.log, msg)
				env.skipped = append(env.skipped, msg)
				continue
			}
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no contender can run")
	}
	return out, nil
}

func isContender(name string) bool {
	for _, c := range contenders {
		if c.name == name {
			return true
		}
	}
	return false
}

func probe(ctx context.Context, env *environment, server string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if server == "redis" {
		return pingRedis(ctx, env.redisAddr)
	}
	return pingPostgres(ctx, env.postgresDSN)
}

// perCaller builds n callers of cycle: caller i is the owner
// "bench-caller-i" and cycles the shared resource, or its own resources
// in turn.
func perCaller(n int, shared bool, cycle func(ctx context.Context, owner, id string) error) []cycleFunc {
	out := make([]cycleFunc, n)
	for i := range out {
		owner := fmt.Sprintf("bench-caller-%d", i)
		ids, k := ownRefs(i), 0
		out[i] = func(ctx context.Context) error {
			id := sharedID
			if !shared {
				id = ids[k%ownResources]
				k++
			}
			return cycle(ctx, owner, id)
		}
	}
	return out
}

// ownRefs names caller i's resources, so that the cycle does not format
// strings.
func ownRefs(i int) [ownResources]string {
	var ids [ownResources]string
	for k := range ids {
		ids[k] = fmt.Sprintf("caller%d-%d", i, k)
	}
	return ids
}

// sharedID is the resource of the one-resource scenario.
const sharedID = "shared"

// pid tags what this run creates on shared servers.
var pid = os.Getpid()
