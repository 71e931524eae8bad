package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// serverPIDs returns the /proc entries of the processes whose command line
// server matches (none when no such server runs on this machine).
func serverPIDs(server func(cmdline string) bool) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && server(strings.ReplaceAll(string(cmd), "\x00", " ")) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// serverCPU returns the CPU time the processes pids have used.
func serverCPU(pids []string) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.Atoi(f[11]) // utime and stime, in clock ticks of 10 ms
		k, _ := strconv.Atoi(f[12])
		total += time.Duration(u+k) * 10 * time.Millisecond
	}
	return total
}

// selfCPU returns the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drainCost is what a variant's timed work (a drain, a publish round) used,
// over all its rounds.
type drainCost struct {
	self, server time.Duration
	mallocs      uint64
	msgs         int
}

// costed runs a variant's timed work on n messages under a profiler label
// naming it, and adds the process's and the server's CPU time and the
// process's heap allocations to c.
func costed(c *drainCost, server func(string) bool, name string, n int, f func() (time.Duration, error)) (time.Duration, error) {
	pids := serverPIDs(server) // looked up before the measurement: the scan of /proc is not the variant's
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	e0 := serverCPU(pids)
	s0 := selfCPU()
	var d time.Duration
	var err error
	pprof.Do(context.Background(), pprof.Labels("variant", name), func(context.Context) { d, err = f() })
	s1 := selfCPU()
	e1 := serverCPU(pids)
	runtime.ReadMemStats(&m1)
	c.self += s1 - s0
	c.server += e1 - e0
	c.mallocs += m1.Mallocs - m0.Mallocs
	c.msgs += n
	return d, err
}

func (c drainCost) cells() []string {
	per := func(d time.Duration) string {
		return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3/float64(c.msgs))
	}
	return []string{per(c.self), per(c.server), fmt.Sprintf("%.0f", float64(c.mallocs)/float64(c.msgs))}
}

// costRows puts each variant's drain costs before its configuration cell.
func costRows(rs [][]string, costs map[string]*drainCost) [][]string {
	for i, r := range rs {
		cells := []string{"", "", ""}
		if c, ok := costs[r[0]]; ok && c.msgs > 0 {
			cells = c.cells()
		}
		rs[i] = append(append(r[:len(r)-1:len(r)-1], cells...), r[len(r)-1])
	}
	return rs
}
