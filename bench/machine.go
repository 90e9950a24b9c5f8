package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// machine describes where the figures come from.
type machine struct {
	cpus      int
	model     string
	goVersion string
	libraries []string // module versions of the drivers and clients
	servers   []string // server versions
}

// describeMachine reads the CPU from /proc/cpuinfo, the library versions
// from the binary's build information, and asks the servers of the
// selected contenders theirs; what it cannot learn it leaves out.
func describeMachine(ctx context.Context, env *environment, selected []contender) machine {
	m := machine{cpus: runtime.NumCPU(), model: cpuModel(), goVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			switch d.Path {
			case "modernc.org/sqlite", "github.com/jackc/pgx/v5", "github.com/bsm/redislock", "github.com/redis/go-redis/v9":
				m.libraries = append(m.libraries, d.Path+" "+d.Version)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	servers := map[string]bool{}
	for _, c := range selected {
		servers[c.server] = true
	}
	if servers["postgres"] {
		m.servers = append(m.servers, "PostgreSQL "+postgresVersion(ctx, env.postgresDSN))
	}
	if servers["redis"] {
		m.servers = append(m.servers, "Redis "+redisVersion(ctx, env.redisAddr))
	}
	return m
}

func postgresVersion(ctx context.Context, dsn string) string {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return ""
	}
	defer conn.Close(context.Background())
	var v string
	_ = conn.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v
}

func redisVersion(ctx context.Context, addr string) string {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// loadAverage returns the 1, 5 and 15 minute load averages, from
// /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func (m machine) String() string {
	s := fmt.Sprintf("%d CPUs (`nproc`), %s (`/proc/cpuinfo`), %s", m.cpus, m.model, m.goVersion)
	if len(m.libraries) > 0 {
		s += "; " + strings.Join(m.libraries, ", ")
	}
	if len(m.servers) > 0 {
		s += "; " + strings.Join(m.servers, ", ") + " on the same machine, over loopback"
	}
	return s
}
