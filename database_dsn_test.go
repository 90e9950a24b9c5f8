package locks_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// validKeywordDSNs are libpq keyword/value strings that PostgreSQL's
// clients (libpq, and pgx, which the module uses) accept: spaces around
// "=", quoted values with escapes, every kind of white space between
// pairs, an empty value.
var validKeywordDSNs = []string{
	"host=127.0.0.1 user=postgres dbname=test sslmode=disable connect_timeout=5",
	"host = db  port= 5432 dbname =agents",
	"host=db\tdbname=agents\nuser=app\r\nsslmode=require",
	"  host=db dbname=agents  ",
	`host=db password='a \' b' dbname='my db'`,
	`host=db password=a\ b dbname=agents`,
	"host=db application_name='' dbname=agents",
	"dbname=agents",
	"host=/var/run/postgresql dbname=agents",
	"host=db dbname=agents statement_timeout=5000", // a server setting, which pgx passes on
	"service=locks",
}

// openRefused opens database in an empty working directory and checks
// that Open refuses it with a *domain.ValidationError and creates nothing.
func openRefused(t *testing.T, database string) *domain.ValidationError {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	c, err := locks.Open(context.Background(), locks.Config{Database: database})
	if c != nil {
		_ = c.Close()
	}
	var ve *domain.ValidationError
	require.ErrorAs(t, err, &ve, "%q", database)
	assert.Equal(t, "database", ve.Field)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "%q: a refused database creates nothing", database)
	return ve
}

// keywordNeighbours returns malformed neighbours of a valid keyword/value
// DSN: each keyword without its value ("connect_timeout"), a stray word
// at every gap, a quote opened and never closed in each value, and each
// keyword in upper case.
func keywordNeighbours(dsn string) []string {
	words := strings.Fields(dsn)
	var out []string
	if strings.Contains(dsn, "' ") {
		words = nil // a quoted value with a space: the words are not pairs
	}
	for i, w := range words {
		key, _, ok := strings.Cut(w, "=")
		if !ok || key == "" {
			continue // a pair written with spaces around "=": covered by the others
		}
		with := func(repl string) string {
			ws := append([]string(nil), words...)
			ws[i] = repl
			return strings.Join(ws, " ")
		}
		out = append(out, with(key), with(key+"='"+strings.Trim(w[len(key)+1:], "'")))
		if key != "statement_timeout" { // a server setting, whose name the server reads in any case
			out = append(out, with(strings.ToUpper(w[:1])+w[1:]), with(strings.ToUpper(key)+w[len(key):]))
		}
		stray := append(append(append([]string(nil), words[:i]...), "stray"), words[i:]...)
		out = append(out, strings.Join(stray, " "))
	}
	return append(out, dsn+" stray", dsn+" '")
}

// TestOpen_KeywordValueNeverAFile: a string that reads as a libpq
// keyword/value DSN never names a SQLite file. A valid one is a PostgreSQL
// DSN (this program does not import the PostgreSQL store, so Open says
// which package to import); every malformed neighbour of one is a
// validation error that says what is wrong, and creates nothing.
func TestOpen_KeywordValueNeverAFile(t *testing.T) {
	for _, dsn := range validKeywordDSNs {
		assert.True(t, locks.IsPostgres(dsn), "%q", dsn)
		assert.Contains(t, openRefused(t, dsn).Reason, "import "+locks.PostgresPackage, "%q", dsn)
	}
	for _, dsn := range validKeywordDSNs {
		for _, bad := range keywordNeighbours(dsn) {
			assert.False(t, locks.IsPostgres(bad), "%q", bad)
			ve := openRefused(t, bad)
			assert.NotContains(t, ve.Reason, "import "+locks.PostgresPackage, "%q is malformed, not merely unlinked", bad)
		}
	}
	// What the error says: the keyword without a value, the word that is
	// no keyword, the quote, the case.
	for dsn, says := range map[string]string{
		"host=127.0.0.1 user=postgres dbname=test sslmode=disable connect_timeout": `"connect_timeout" has no "=" and value`,
		"host=db stray dbname=test":                `"stray" has no "=" and value`,
		"host=db password='secret dbname=test":     `the value of password opens a quote (') that never closes`,
		"HOST=x":                                   `"HOST" is not a libpq keyword: they are lower case (host)`,
		"host=db Dbname=test":                      `"Dbname" is not a libpq keyword: they are lower case (dbname)`,
		"notes=2024.db":                            `for a SQLite file of that name, write ./notes=2024.db`,
		"api_token=secret":                         `write ./NAME`,
		"host=db dbname=test password=secret conn": `"conn" has no "=" and value`,
		"host=db\x00 dbname=test":                  "NUL",
	} {
		ve := openRefused(t, dsn)
		assert.Contains(t, ve.Reason, says, "%q", dsn)
		assert.NotContains(t, ve.Reason, "secret", "%q: the error never quotes a value", dsn)
	}
}

// TestOpen_BareKeyword: one libpq keyword alone, in any case, is a DSN
// that lacks its "=value" (libpq: "missing = after host"), not the name
// of a file; the error says how to name a file of that name. A word that
// is no keyword of libpq's still names a file.
func TestOpen_BareKeyword(t *testing.T) {
	for _, db := range []string{"host", "dbname", "HOSTADDR", "Port", " user", "sslmode\n"} {
		ve := openRefused(t, db)
		assert.Contains(t, ve.Reason, `lacks "=value"`, "%q", db)
		assert.Contains(t, ve.Reason, "./"+strings.TrimSpace(db), "%q", db)
		assert.False(t, locks.IsPostgres(db), "%q", db)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	for _, db := range []string{"agents", "./host", "hosts"} {
		c, err := locks.Open(context.Background(), locks.Config{Database: db})
		require.NoError(t, err, db)
		require.NoError(t, c.Close())
	}
}

// TestOpen_UnicodeBlankDatabase: Unicode white space (NBSP, the
// ideographic space) and invisible format characters (a zero-width
// space, a byte-order mark) are blank as ASCII white space is: alone
// they name nothing, and at either end of a file's name they are taken
// for a typo.
func TestOpen_UnicodeBlankDatabase(t *testing.T) {
	for _, db := range []string{"\u00a0", "\u3000", "\u200b", "\ufeff", " \u00a0\u200b\t", "\u2028", "\u00ad"} {
		assert.Contains(t, openRefused(t, db).Reason, "is blank", "%q", db)
	}
	for _, db := range []string{"\u00a0agents.db", "agents.db\u3000", "\u200bagents.db", "agents.db\u200d", "\ufeffagents.db"} {
		assert.Contains(t, openRefused(t, db).Reason, "begins or ends with white space", "%q", db)
	}
	// Inside a name they are the name's own.
	dir := t.TempDir()
	t.Chdir(dir)
	c, err := locks.Open(context.Background(), locks.Config{Database: "my\u00a0notes.db"})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestOpen_BlankDatabase: white space alone names nothing (it used to name
// a file), and a file name that begins or ends with white space is taken
// for a typo.
func TestOpen_BlankDatabase(t *testing.T) {
	for _, db := range []string{" ", "\n", "\t", " \r\n\t "} {
		assert.Contains(t, openRefused(t, db).Reason, "is blank", "%q", db)
	}
	for _, db := range []string{" agents.db", "agents.db\n", "agents.db "} {
		assert.Contains(t, openRefused(t, db).Reason, "begins or ends with white space", "%q", db)
	}
	// A file whose name has a "=" or white space in it is still reachable:
	// through a directory, or a file: URI.
	dir := t.TempDir()
	t.Chdir(dir)
	for _, db := range []string{"./notes=2024.db", "./host=x.db", "file:my%20notes.db", "file:host=db dbname=x.db"} {
		c, err := locks.Open(context.Background(), locks.Config{Database: db})
		require.NoError(t, err, db)
		require.NoError(t, c.Close())
	}
}
