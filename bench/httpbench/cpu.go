package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// cpuMeter reads the CPU time this process used and the CPU time of the
// PostgreSQL backends serving the bench's pool (found by application_name;
// on Linux, from /proc/<pid>/schedstat, in nanoseconds). Behind PgBouncer,
// whose server connections take the application_name of the client they
// serve, these are PgBouncer's server connections, and PgBouncer itself
// (pids). The server must be
// on this machine for the backends' share; it reads 0 otherwise.
type cpuMeter struct {
	conn *pgx.Conn // the bench's own connection, not the pool's
	apps []string  // application_name of the pools' connections
	pids []int     // other processes to count with the backends (PgBouncer)
}

// cpuSnapshot is the CPU time used so far.
type cpuSnapshot struct {
	self     time.Duration
	backends map[int]time.Duration
}

func (m *cpuMeter) snapshot(ctx context.Context) (cpuSnapshot, error) {
	s := cpuSnapshot{self: selfCPU(), backends: map[int]time.Duration{}}
	rows, err := m.conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1)", m.apps)
	if err != nil {
		return s, fmt.Errorf("backend pids: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return s, fmt.Errorf("backend pids: %w", err)
	}
	for _, pid := range pids {
		if d, ok := schedCPU(int(pid)); ok {
			s.backends[int(pid)] = d
		}
	}
	for _, pid := range m.pids {
		if d, ok := schedCPU(pid); ok {
			s.backends[pid] = d
		}
	}
	return s, nil
}

// since returns the CPU time used by this process and by the backends
// present in both snapshots.
func (s cpuSnapshot) since(prev cpuSnapshot) (self, backends time.Duration) {
	for pid, d := range s.backends {
		if p, ok := prev.backends[pid]; ok {
			backends += d - p
		}
	}
	return s.self - prev.self, backends
}

// selfCPU is the user+system time of this process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// schedCPU is the time pid spent on a CPU.
func schedCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}
