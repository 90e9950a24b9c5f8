package tests

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The fuzz tests feed hostile strings and durations to every public entry
// point. Their seed corpus runs in the normal suite; explore further with
//
//	go test ./tests -run '^$' -fuzz FuzzAcquire -fuzztime 60s
//
// Each input must either work as documented or fail with a ValidationError:
// never panic, never reach the store with bad input, and never change the
// database file when it is refused.

var hostileStrings = []string{
	"", " ", "\t\n", "\u00a0", "\u2003", "plan", "PLAN", "Plan", "project",
	// A Cyrillic а that looks like "plan"; NUL; invalid UTF-8; a surrogate.
	"pl\u0430n", "p1\x00", "\x00", "a\xffb", "\xc3\x28", "\xed\xa0\x80",
	"'; DROP TABLE locks; --", `" OR 1=1 --`, "%_\\", "?", "$1", "`locks`",
	"\u202eevil", "e\u0301", "ﬁ", "🔒", strings.Repeat("é", 128), strings.Repeat("x", 255),
	strings.Repeat("x", 256), strings.Repeat("A", 10_000),
}

var hostileTTLs = []time.Duration{
	0, 1, -1, domain.MinLockTTL - 1, domain.MinLockTTL, domain.MinLockTTL + 1,
	domain.DefaultLockTTL, domain.MaxLockTTL - 1, domain.MaxLockTTL, domain.MaxLockTTL + 1,
	-domain.MaxLockTTL, 1<<63 - 1, -1 << 63,
}

// validID is the documented rule for owner and resource ids, restated.
func validID(s string) bool {
	return s != "" && len(s) <= 255 && utf8.ValidString(s) && !strings.ContainsRune(s, 0) &&
		strings.IndexFunc(s, func(r rune) bool { return !unicode.IsSpace(r) }) >= 0
}

func validTTL(d time.Duration) bool {
	return d == 0 || (d >= 5*time.Second && d <= time.Hour)
}

// fuzzStore is one SQLite file shared by all inputs of a fuzz test.
type fuzzStore struct {
	path string
	svc  *application.LockService
}

func newFuzzStore(f *testing.F) *fuzzStore {
	path := filepath.Join(f.TempDir(), "locks.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	mc := clock.NewMock()
	mc.Set(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), mc, 0)
	if err != nil {
		f.Fatal(err)
	}
	return &fuzzStore{path: path, svc: svc}
}

// digest hashes the database and its WAL: a refused call must change
// neither.
func (s *fuzzStore) digest(t *testing.T) [32]byte {
	h := sha256.New()
	for _, p := range []string{s.path, s.path + "-wal"} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		h.Write(b)
	}
	return [32]byte(h.Sum(nil))
}

// expectRefused checks that err is a ValidationError and the files did not
// change since before.
func (s *fuzzStore) expectRefused(t *testing.T, op string, err error, before [32]byte) {
	t.Helper()
	var ve *domain.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%s: want a ValidationError, got %v", op, err)
	}
	if s.digest(t) != before {
		t.Fatalf("%s: a refused call changed the database", op)
	}
}

func FuzzAcquire(f *testing.F) {
	for _, s := range hostileStrings {
		f.Add(s, "plan", "id", int64(0))
		f.Add("owner", "plan", s, int64(0))
		f.Add("owner", s, "id", int64(0))
	}
	for _, d := range hostileTTLs {
		f.Add("owner", "project", "id", int64(d))
	}
	store := newFuzzStore(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, owner, typ, id string, ttlNanos int64) {
		ttl := time.Duration(ttlNanos)
		ref := domain.ResourceRef{Type: domain.ResourceType(typ), ID: id}
		valid := validID(owner) && validID(id) && (typ == "plan" || typ == "project") && validTTL(ttl)
		before := store.digest(t)

		l, err := store.svc.Acquire(ctx, owner, ref, ttl)
		if !valid {
			store.expectRefused(t, "acquire", err, before)
			_, err = store.svc.Renew(ctx, owner, ref, ttl)
			store.expectRefused(t, "renew", err, before)
			return
		}
		if err != nil {
			t.Fatalf("acquire(%q, %q, %q, %v): %v", owner, typ, id, ttl, err)
		}
		got, err := store.svc.Get(ctx, ref)
		if err != nil || got != l || got.Owner != owner || got.Resource.ID != id {
			t.Fatalf("the stored lock does not round-trip: got %+v, %v; acquired %+v", got, err, l)
		}
		if _, err := store.svc.Renew(ctx, owner, ref, ttl); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if ok, err := store.svc.Release(ctx, owner, ref); err != nil || !ok {
			t.Fatalf("release: %v, %v", ok, err)
		}
	})
}

func FuzzReleaseAndList(f *testing.F) {
	for _, s := range hostileStrings {
		f.Add(s, "plan")
		f.Add("owner", s)
	}
	store := newFuzzStore(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, owner, typ string) {
		ref := domain.ResourceRef{Type: domain.ResourceType(typ), ID: "id"}
		validType := typ == "plan" || typ == "project"
		before := store.digest(t)

		_, err := store.svc.Release(ctx, owner, ref)
		if !validID(owner) || !validType {
			store.expectRefused(t, "release", err, before)
		} else if err != nil {
			t.Fatalf("release: %v", err)
		}
		_, err = store.svc.ReleaseAllForOwner(ctx, owner)
		if !validID(owner) {
			store.expectRefused(t, "release-all", err, before)
		} else if err != nil {
			t.Fatalf("release-all: %v", err)
		}
		_, err = store.svc.List(ctx, application.ListOptions{Owner: owner, Type: domain.ResourceType(typ)})
		switch {
		case (owner != "" && !validID(owner)) || (typ != "" && !validType):
			store.expectRefused(t, "list", err, before)
		case err != nil:
			t.Fatalf("list: %v", err)
		}
	})
}

func FuzzOpenConfig(f *testing.F) {
	for _, s := range hostileStrings {
		f.Add(s, int64(0))
	}
	for _, d := range hostileTTLs {
		f.Add("owner", int64(d))
	}
	f.Fuzz(func(t *testing.T, owner string, ttlNanos int64) {
		ttl := time.Duration(ttlNanos)
		c, err := locks.Open(context.Background(), locks.Config{Database: locks.MemoryDatabase, Owner: owner, DefaultTTL: ttl})
		valid := (owner == "" || validID(owner)) && validTTL(ttl)
		if !valid {
			if !errors.Is(err, domain.ErrValidation) {
				t.Fatalf("open(owner %q, ttl %v): want a ValidationError, got %v", owner, ttl, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("open(owner %q, ttl %v): %v", owner, ttl, err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzDSN(f *testing.F) {
	for _, s := range hostileStrings {
		f.Add(s)
		f.Add("file:" + s)
		f.Add("file:x.db?" + s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		dsn, err := sqlite.DSN(path, 0)
		if err != nil {
			return
		}
		_, query, _ := strings.Cut(dsn, "?")
		q, qerr := url.ParseQuery(query)
		if !strings.HasPrefix(dsn, "file:") || qerr != nil {
			t.Fatalf("DSN(%q) = %q: not a file: URI with a query (%v)", path, dsn, qerr)
		}
		if tx := q["_txlock"]; len(tx) != 1 || tx[0] != "immediate" {
			t.Fatalf("DSN(%q) = %q: _txlock must be immediate, and not overridable", path, dsn)
		}
	})
}
