package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary serve as a worker of the multi-process
// case, as the bench binary does.
func TestMain(m *testing.M) {
	if mode := os.Getenv(workerEnv); mode != "" {
		os.Exit(workerMain(mode, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// TestRun_SQLite runs the whole harness in its tiny profile on SQLite
// only, and checks that every table has its rows and that the document's
// marked section, and only it, is rewritten.
func TestRun_SQLite(t *testing.T) {
	opts := tinyRun
	opts.contenders = []string{"module-sqlite", "floor-sqlite"}
	opts.out = filepath.Join(t.TempDir(), "performance.md")
	require.NoError(t, os.WriteFile(opts.out, []byte("# Before\n\n"+beginMarker+"\nold figures\n"+endMarker+"\n\n# After\n"), 0o644))
	var stdout, log bytes.Buffer
	require.NoError(t, run(context.Background(), opts, &stdout, &log), "log:\n%s", log.String())

	out := stdout.String()
	for _, sc := range scenarios {
		for _, c := range opts.contenders {
			assert.Contains(t, out, "| "+sc.name+" | "+c+" | ")
		}
	}
	for _, want := range []string{
		"| module-sqlite ÷ floor-sqlite, 8 on one resource | ",
		"| 2 processes, module: fairness (worst round) | ",
		"| module-sqlite | ", "| floor-sqlite | ", // the multi-process table
		"| 1 caller | module-sqlite, 100 rows | ", "| 1 caller | module-sqlite, 1,000 rows | ",
		"| during the purge | ", "| alone, afterwards | ",
		"| module-sqlite ÷ redislock, 32 callers | not measured |",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "failed:")

	doc, err := os.ReadFile(opts.out)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(doc), "# Before\n\n"+beginMarker+"\n"))
	assert.True(t, strings.HasSuffix(string(doc), endMarker+"\n\n# After\n"))
	assert.NotContains(t, string(doc), "old figures")
	assert.Contains(t, string(doc), "](performance-concurrency.svg)")
	svg, err := os.ReadFile(filepath.Join(filepath.Dir(opts.out), "performance-concurrency.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(svg), "<svg")
}

// TestRun_Servers runs the tiny profile with the contenders that need
// Redis or PostgreSQL, each skipped when its server does not answer.
func TestRun_Servers(t *testing.T) {
	opts := tinyRun
	opts.postgresDSN = envOr("LOCKS_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	opts.redisAddr = "127.0.0.1:6379"
	env := &environment{postgresDSN: opts.postgresDSN, redisAddr: opts.redisAddr}
	for _, c := range contenders {
		if c.server == "" {
			continue
		}
		if err := probe(context.Background(), env, c.server); err != nil {
			t.Logf("%s skipped: %s unreachable at the test's address (%v)", c.name, c.server, err)
			continue
		}
		opts.contenders = append(opts.contenders, c.name)
	}
	if len(opts.contenders) == 0 {
		t.Skip("neither Redis (127.0.0.1:6379) nor PostgreSQL (LOCKS_TEST_POSTGRES_DSN) answers")
	}
	var stdout, log bytes.Buffer
	require.NoError(t, run(context.Background(), opts, &stdout, &log), "log:\n%s", log.String())
	for _, sc := range scenarios {
		for _, c := range opts.contenders {
			assert.Contains(t, stdout.String(), "| "+sc.name+" | "+c+" | ")
		}
	}
	assert.NotContains(t, stdout.String(), "failed:")
}

// TestSelectContenders_SkipsUnreachable: a server that does not answer
// leaves its contenders out with a message, and the others run.
func TestSelectContenders_SkipsUnreachable(t *testing.T) {
	var log bytes.Buffer
	env := &environment{
		postgresDSN: "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=1",
		redisAddr:   "127.0.0.1:1",
		log:         &log,
	}
	got, err := selectContenders(context.Background(), env, nil)
	require.NoError(t, err)
	var names []string
	for _, c := range got {
		names = append(names, c.name)
	}
	assert.Equal(t, []string{"module-sqlite", "floor-sqlite"}, names)
	assert.Len(t, env.skipped, 4)
	assert.Contains(t, log.String(), "redislock skipped: redis unreachable")
	assert.Contains(t, log.String(), "pg-advisory skipped: postgres unreachable")

	_, err = selectContenders(context.Background(), env, []string{"etcd"})
	assert.ErrorContains(t, err, `no contender is called "etcd"`)
}

// TestWrite_NeedsMarkers: a document without the markers is left alone
// and the error says what to add.
func TestWrite_NeedsMarkers(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "performance.md")
	require.NoError(t, os.WriteFile(doc, []byte("# Performance\n"), 0o644))
	err := (&report{}).write(doc, "")
	assert.ErrorContains(t, err, "add the markers")
	b, _ := os.ReadFile(doc)
	assert.Equal(t, "# Performance\n", string(b))
}
