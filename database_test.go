package locks_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// The root package's tests do not import adapters/postgres: they are a
// program that uses SQLite only.

// TestOpen_DatabaseKinds checks what Open says of a database it cannot
// take: every error names the kinds it accepts, a PostgreSQL DSN in a
// program without PostgreSQL support says which package to import, and a
// URL of another database is refused rather than becoming a file name.
func TestOpen_DatabaseKinds(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, database string) *domain.ValidationError {
		t.Helper()
		c, err := locks.Open(ctx, locks.Config{Database: database})
		if c != nil {
			_ = c.Close()
		}
		require.ErrorIs(t, err, domain.ErrValidation)
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "database", ve.Field)
		return ve
	}
	namesEveryKind := func(t *testing.T, err error) {
		t.Helper()
		for _, kind := range []string{"SQLite", `"file:"`, "PostgreSQL", "postgres://", locks.MemoryDatabase, locks.PostgresPackage} {
			assert.Contains(t, err.Error(), kind)
		}
	}

	t.Run("Empty", func(t *testing.T) {
		namesEveryKind(t, open(t, ""))
	})
	t.Run("PostgresNotLinked", func(t *testing.T) {
		for _, dsn := range []string{
			"postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
			"postgresql://db/agents",
			"host=db dbname=agents",
		} {
			err := open(t, dsn)
			assert.Contains(t, err.Error(), "import github.com/cleveragents/locks/adapters/postgres to enable PostgreSQL", dsn)
		}
	})
	t.Run("UnknownSchemes", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		for _, dsn := range []string{"mysql://app@db/agents", "http://example.com/agents.db", "sqlite://agents.db", "HTTPS://x"} {
			err := open(t, dsn)
			scheme, _, _ := strings.Cut(dsn, "://")
			assert.Contains(t, err.Error(), "the "+scheme+":// scheme is not supported", dsn)
			namesEveryKind(t, err)
		}
		// A scheme without "//" is no file name either (it used to make
		// one), nor is "file:" in capitals, which SQLite does not read
		// as a URI.
		for dsn, says := range map[string]string{
			"mysql:agents":          "the mysql: scheme is not supported",
			"sqlite:a.db":           "the sqlite: scheme is not supported",
			"postgres:dbname=test":  "postgres://",
			"FILE:x.db":             `write "file:" in lower case`,
			"Postgres://u@h/test":   "write the scheme in lower case",
			"POSTGRESQL://u@h/test": "write the scheme in lower case",
		} {
			err := open(t, dsn)
			assert.Contains(t, err.Error(), says, dsn)
		}
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, entries, "a refused database writes nothing")
	})
	t.Run("FileURIAndPathsStillOpen", func(t *testing.T) {
		dir := t.TempDir()
		for _, db := range []string{dir + "/a.db", "file:" + dir + "/b.db", "file://" + dir + "/c.db", locks.MemoryDatabase} {
			c, err := locks.Open(ctx, locks.Config{Database: db})
			require.NoError(t, err, db)
			require.NoError(t, c.Close())
		}
	})
}

// TestMinimalEmbeddingLinks checks what a program that embeds the module
// on SQLite links (go list -deps of examples/minimal-sqlite): no
// PostgreSQL driver nor adapter (only its pgx-free DSN grammar), none of
// the test-only packages, no migration tooling (Atlas, used only to write migration files), while
// examples/minimal-postgres, which imports adapters/postgres, links pgx.
func TestMinimalEmbeddingLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	deps := func(pkg string) []string {
		out, err := exec.Command(goTool, "list", "-deps", pkg).Output()
		require.NoError(t, err, "go list -deps %s", pkg)
		return strings.Fields(string(out))
	}
	for _, p := range deps("./examples/minimal-sqlite") {
		if p == locks.PostgresPackage+"/pgdsn" {
			continue // the DSN grammar, pgx-free: Open must still recognise a PostgreSQL DSN
		}
		for _, banned := range []string{"github.com/jackc/", "/adapters/postgres", "github.com/stretchr/testify", "/locktest",
			"github.com/google/wire", "go.opentelemetry.io/otel/sdk", "ariga.io/atlas", "github.com/hashicorp/hcl"} {
			assert.NotContains(t, p, banned, "a SQLite-only embedding links %s", p)
		}
	}
	assert.Contains(t, deps("./examples/minimal-postgres"), "github.com/jackc/pgx/v5")
}
