package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// build is one checkout of the lock module, compiled into ./cycles.
type build struct{ name, dir, bin string }

// compareBuilds runs the acquire+release cycle of each build of spec
// ("name=dir,name=dir": checkouts of the lock module, e.g. a git
// worktree of an older commit) and its database/sql floor, at 1, 8 and
// 32 callers on SQLite, builds and contenders alternating in every round,
// and prints the median cycles per second and the ratio to the floor of
// the same process.
func compareBuilds(ctx context.Context, spec string, rounds int, roundFor time.Duration, out, log io.Writer) error {
	tmp, err := os.MkdirTemp("", "locks-builds-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var builds []build
	for i, nd := range strings.Split(spec, ",") {
		name, dir, ok := strings.Cut(nd, "=")
		if !ok {
			return fmt.Errorf("-builds: want name=dir, not %q", nd)
		}
		b := build{name: name, bin: filepath.Join(tmp, fmt.Sprintf("cycles-%d", i))}
		if b.dir, err = filepath.Abs(dir); err != nil {
			return err
		}
		fmt.Fprintf(log, "building %s from %s\n", b.name, b.dir)
		if err := b.compile(ctx, tmp, i); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		builds = append(builds, b)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "callers\tbuild\tmodule cycles/s\tfloor cycles/s\tratio to floor\tratios per round\t")
	for _, callers := range []int{1, 8, 32} {
		fmt.Fprintf(log, "%d callers: %d rounds of %v per build and contender\n", callers, rounds, roundFor)
		res, err := roundsOfBuilds(ctx, builds, callers, rounds, roundFor)
		if err != nil {
			return err
		}
		for i, b := range builds {
			r := res[i]
			var per []string
			for k := range r.module {
				per = append(per, fmt.Sprintf("%.2f", r.module[k]/r.floor[k]))
			}
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.2f\t%s\t\n", callers, b.name, median(r.module), median(r.floor),
				median(r.ratios()), strings.Join(per, " "))
		}
	}
	return tw.Flush()
}

// compile builds ./cycles against b.dir, through a copy of go.mod whose
// replace names it.
func (b *build) compile(ctx context.Context, tmp string, i int) error {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		return err
	}
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^replace github.com/cleveragents/locks => .*$`)
	mod = re.ReplaceAll(mod, []byte("replace github.com/cleveragents/locks => "+b.dir))
	modfile := filepath.Join(tmp, fmt.Sprintf("go-%d.mod", i))
	if err := os.WriteFile(modfile, mod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(strings.TrimSuffix(modfile, ".mod")+".sum", sum, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-modfile="+modfile, "-o", b.bin, "./cycles")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

// buildRates are one build's rates, one per round.
type buildRates struct{ module, floor []float64 }

func (r buildRates) ratios() []float64 {
	out := make([]float64, len(r.module))
	for k := range r.module {
		out[k] = r.module[k] / r.floor[k]
	}
	return out
}

// roundsOfBuilds starts a ./cycles process per build, warms each up, and
// runs rounds in which every build runs its module and its floor in
// turn; the order of the builds and of the two contenders rotates.
func roundsOfBuilds(ctx context.Context, builds []build, callers, rounds int, roundFor time.Duration) ([]buildRates, error) {
	type worker struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	ws := make([]*worker, len(builds))
	defer func() {
		for _, w := range ws {
			if w != nil {
				w.in.Close()
				_ = w.cmd.Wait()
			}
		}
	}()
	for i, b := range builds {
		cmd := exec.CommandContext(ctx, b.bin, "-callers", strconv.Itoa(callers))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		ws[i] = &worker{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	}
	ask := func(w *worker, contender string, d time.Duration) (float64, error) {
		if _, err := fmt.Fprintf(w.in, "%s %v\n", contender, d); err != nil {
			return 0, err
		}
		if !w.out.Scan() {
			return 0, fmt.Errorf("the worker ended: %v", w.out.Err())
		}
		return strconv.ParseFloat(w.out.Text(), 64)
	}
	res := make([]buildRates, len(builds))
	warmUp := min(roundFor, 200*time.Millisecond)
	for round := -1; round < rounds; round++ {
		for k := range ws {
			i := (k + max(round, 0)) % len(ws)
			order := []string{"module", "floor"}
			if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			rates := map[string]float64{}
			for _, c := range order {
				d := roundFor
				if round < 0 {
					d = warmUp
				}
				r, err := ask(ws[i], c, d)
				if err != nil {
					return nil, fmt.Errorf("%s, %s: %w", builds[i].name, c, err)
				}
				rates[c] = r
			}
			if round >= 0 {
				res[i].module = append(res[i].module, rates["module"])
				res[i].floor = append(res[i].floor, rates["floor"])
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return res, nil
}
