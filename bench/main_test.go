package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

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
	opts.handover = handoverOff // TestRun_Handover
	opts.contenders = []string{"module-sqlite", "floor-sqlite"}
	opts.out = filepath.Join(t.TempDir(), "performance.md")
	require.NoError(t, os.WriteFile(opts.out, []byte("# Before\n\n"+beginMarker+"\nold figures\n"+endMarker+"\n\n# After\n"), 0o644))
	var stdout, log bytes.Buffer
	require.NoError(t, run(context.Background(), opts, &stdout, &log), "log:\n%s", log.String())

	out := stdout.String()
	for _, c := range opts.contenders {
		assert.Regexp(t, latencyRow(c), out)
	}
	for _, want := range []string{
		"| module-sqlite ÷ floor-sqlite, 8 on one resource | ",
		"| 2 processes, module: fairness (worst round) | ",
		"| module-sqlite | ", "| floor-sqlite | ", // the multi-process table
		"| 1 caller | module-sqlite, 100 rows | ", "| 1 caller | module-sqlite, 1,000 rows | ",
		"| during the purge | ", "| alone, afterwards | ",
		"| module-sqlite ÷ redislock, 32 callers | not measured |",
		"| module-postgres ÷ floor-postgres, 128 callers | not measured | ≥ 6.0 |",
	} {
		assert.Contains(t, out, want)
	}
	// The headline: a column per scenario, the module's ratio to its floor.
	assert.Regexp(t, `(?m)^\| module-sqlite( \| [0-9,]+ \([0-9.]+×\)){5} \|$`, out)
	assert.Regexp(t, `(?m)^\| floor-sqlite( \| [0-9,]+){5} \|$`, out)
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

// latencyRow matches contender c's row of the latency table: figures in
// every scenario's column.
func latencyRow(c string) string {
	return fmt.Sprintf(`(?m)^\| %s( \| [0-9.]+ / [0-9.]+ / [0-9.]+ \[[0-9,]+–[0-9,]+\]){%d} \|$`, regexp.QuoteMeta(c), len(scenarios))
}

// TestRun_Servers runs the tiny profile with the contenders that need
// Redis or PostgreSQL, each skipped when its server does not answer.
func TestRun_Servers(t *testing.T) {
	opts := tinyRun
	opts.handover = handoverOff // TestRun_Handover
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
	for _, c := range opts.contenders {
		assert.Regexp(t, latencyRow(c), stdout.String())
	}
	assert.NotContains(t, stdout.String(), "failed:")
}

// TestRun_Handover runs the tiny hand-over cases alone, on SQLite and on
// PostgreSQL if it answers, and checks that every case has figures, and
// that only the hand-over section of the document is rewritten.
func TestRun_Handover(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the hand-over cases run on Linux only")
	}
	opts := tinyRun
	opts.handover = handoverOnly
	opts.postgresDSN = envOr("LOCKS_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	opts.contenders = []string{"module-sqlite"}
	pg := probe(context.Background(), &environment{postgresDSN: opts.postgresDSN}, "postgres") == nil
	if pg {
		opts.contenders = append(opts.contenders, "module-postgres")
	} else {
		t.Log("PostgreSQL cases skipped: PostgreSQL does not answer at LOCKS_TEST_POSTGRES_DSN")
	}
	opts.out = filepath.Join(t.TempDir(), "performance.md")
	const doc = "# Before\n\n" + beginMarker + "\nold figures\n" + endMarker + "\n\n## Hand-over\n\n" +
		handoverBegin + "\nold hand-over figures\n" + handoverEnd + "\n\n# After\n"
	require.NoError(t, os.WriteFile(opts.out, []byte(doc), 0o644))
	var stdout, log bytes.Buffer
	require.NoError(t, run(context.Background(), opts, &stdout, &log), "log:\n%s", log.String())

	out := stdout.String()
	assert.NotContains(t, out, "failed:")
	assert.NotContains(t, out, "### Callers in one process")
	// A row of figures: the case, how, n, then p50, p99, worst and mean in
	// milliseconds. A CLI run may be discarded (its waiter started late):
	// its n may be smaller.
	cases := map[string]string{"module-sqlite": fmt.Sprint(tinyRun.handovers), "flock(2)": fmt.Sprint(tinyRun.handovers),
		"exec alone": "[0-9]+", "agents-sqlite": "[0-9]+", "flock(1)": "[0-9]+"}
	if pg {
		cases["module-postgres"], cases["pg_advisory_lock"], cases["agents-postgres"] = fmt.Sprint(tinyRun.handovers), fmt.Sprint(tinyRun.handovers), "[0-9]+"
	}
	for name, n := range cases {
		assert.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(name)+` \| [^|]+ \| `+n+` \| [0-9.]+ ms \| [0-9.]+ ms \| [0-9.]+ ms \| [0-9.]+ ms \|`, out)
	}
	assert.Regexp(t, `(?m)^\| module-sqlite( \| [0-9.]+ ms){4} \| [0-9.]+ \|$`, out)                                  // the try that took the lock
	assert.Regexp(t, `(?m)^\| module-sqlite \| [0-9.]+s \| [0-9.]+ ms \| [0-9.]+ ms/s \| [0-9]+ \| [0-9.]+ \|$`, out) // idle
	assert.Regexp(t, `(?m)^\| flock\(2\) \| [0-9.]+s \| [0-9.]+ ms \| [0-9.]+ ms/s \| not counted \|`, out)
	assert.Regexp(t, `(?m)^\| module-sqlite \| [0-9]+ \| [0-9, ]+ \| [0-9]+ \| [0-9]+ \| [0-9.]+ \|$`, out) // fairness
	assert.Regexp(t, `(?m)^\| module-sqlite: hand-over p50 \| [0-9.]+ ms \| ≤ 2.0 ms \| (met|\*\*not met\*\*) \|$`, out)

	b, err := os.ReadFile(opts.out)
	require.NoError(t, err)
	got := string(b)
	assert.True(t, strings.HasPrefix(got, "# Before\n\n"+beginMarker+"\nold figures\n"+endMarker+"\n\n## Hand-over\n\n"+handoverBegin+"\n"), got)
	assert.True(t, strings.HasSuffix(got, handoverEnd+"\n\n# After\n"))
	assert.NotContains(t, got, "old hand-over figures")
	assert.Contains(t, got, "](performance-handover.svg)")
	svg, err := os.ReadFile(filepath.Join(filepath.Dir(opts.out), "performance-handover.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(svg), "<svg")
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

// TestRun_Loss runs the tiny prompt-loss cases alone, on SQLite and on
// PostgreSQL if it answers, and checks that every case has figures, that
// the holder was told of a loss, and that only the prompt-loss section of
// the document is rewritten.
func TestRun_Loss(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the prompt-loss cases run on Linux only")
	}
	opts := tinyRun
	opts.loss = lossOnly
	opts.postgresDSN = envOr("LOCKS_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	opts.contenders = []string{"module-sqlite"}
	pg := probe(context.Background(), &environment{postgresDSN: opts.postgresDSN}, "postgres") == nil
	if pg {
		opts.contenders = append(opts.contenders, "module-postgres")
	} else {
		t.Log("PostgreSQL cases skipped: PostgreSQL does not answer at LOCKS_TEST_POSTGRES_DSN")
	}
	opts.out = filepath.Join(t.TempDir(), "performance.md")
	const doc = "# Before\n\n" + beginMarker + "\nold figures\n" + endMarker + "\n\n" + handoverBegin + "\nold hand-over figures\n" +
		handoverEnd + "\n\n## Prompt loss\n\n" + lossBegin + "\nold loss figures\n" + lossEnd + "\n\n# After\n"
	require.NoError(t, os.WriteFile(opts.out, []byte(doc), 0o644))
	var stdout, log bytes.Buffer
	require.NoError(t, run(context.Background(), opts, &stdout, &log), "log:\n%s", log.String())

	out := stdout.String()
	assert.NotContains(t, out, "failed:")
	assert.NotContains(t, out, "### Callers in one process")
	assert.NotContains(t, out, "### Hand-over latency")
	stores := []string{"module-sqlite"}
	if pg {
		stores = append(stores, "module-postgres")
	}
	for _, s := range stores {
		for _, c := range []string{s + ", removed, then taken", s + ", taken over"} {
			assert.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(c)+` \| [^|]+ \| `+fmt.Sprint(tinyRun.handovers)+`( \| [0-9.]+ ms){4} \|$`, out)
			assert.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(c)+`: loss heard, p99 \| [0-9.]+ ms \| ≤ 200 ms \| (met|\*\*not met\*\*) \|$`, out)
		}
		// The takeover's holder is told who took it; the removed one may
		// learn of the removal or of the takeover that follows it.
		assert.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(s)+`, taken over \| taken over: `+fmt.Sprint(tinyRun.handovers)+` \|$`, out)
		assert.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(s)+`, removed, then taken \| ((removed|taken over): [0-9]+(, )?)+ \|$`, out)
	}

	b, err := os.ReadFile(opts.out)
	require.NoError(t, err)
	got := string(b)
	before, _, _ := strings.Cut(doc, lossBegin)
	assert.True(t, strings.HasPrefix(got, before+lossBegin+"\n"), got)
	assert.True(t, strings.HasSuffix(got, lossEnd+"\n\n# After\n"))
	assert.NotContains(t, got, "old loss figures")
}

// TestLossText: each case has a row of figures, a goal row against the
// bound that says whether it was met, and its reasons; a failed case says
// why, and its goal is not measured.
func TestLossText(t *testing.T) {
	ds := func(ms ...int) []time.Duration {
		var out []time.Duration
		for _, m := range ms {
			out = append(out, time.Duration(m)*time.Millisecond)
		}
		return out
	}
	r := &report{opts: options{handovers: 3, command: "cd bench && go run . -loss only"}, loss: &lossReport{
		cases: []*lossCase{
			{c: &handoverCase{name: "module-sqlite, taken over", how: "a takeover", latencies: ds(1, 2, 3)}, reasons: map[string]int{"taken over": 3}},
			{c: &handoverCase{name: "module-postgres, taken over", how: "a takeover", latencies: ds(5, 150, 250)},
				reasons: map[string]int{"taken over": 2, "removed": 1}},
			{c: &handoverCase{name: "module-postgres, removed, then taken", how: "a removal", err: errors.New("the holder does not\nwatch")}},
		},
		skipped: []string{"nothing skipped, really"},
	}}
	out := r.lossText()
	for _, want := range []string{
		"Command: `cd bench && go run . -loss only`",
		"- nothing skipped, really\n",
		"| module-sqlite, taken over: loss heard, p99 | 3.0 ms | ≤ 200 ms | met |\n",
		"| module-postgres, taken over: loss heard, p99 | 250 ms | ≤ 200 ms | **not met** |\n",
		"| module-postgres, removed, then taken: loss heard, p99 | not measured | ≤ 200 ms | |\n",
		"with a TTL of 20s (its renewal, at TTL/2, would find a loss 10s late)",
		"3 rounds per case",
		"| module-sqlite, taken over | a takeover | 3 | 2.0 ms | 3.0 ms | 3.0 ms | 2.0 ms |\n",
		"| module-postgres, removed, then taken | a removal | failed: the holder does not watch | | | | |\n",
		"| module-sqlite, taken over | taken over: 3 |\n",
		"| module-postgres, taken over | removed: 1, taken over: 2 |\n",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "| module-postgres, removed, then taken | removed")
}
