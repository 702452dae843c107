package cudacore

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Noop does nothing and returns x. It measures the cost of a crossing from Python with the GIL held and
// is what the GIL-policy tests call.
//
//cudacore:gil hold
//cudacore:door hot
func Noop(x int) (int, error) {
	return guard("cudacore.noop", func() (int, error) { return x, nil })
}

// NoopReleased does nothing but sleep for ms milliseconds with the GIL released, and returns ms. It
// measures the cost of a GIL-releasing crossing and lets tests prove that a releasing call lets other
// Python threads run.
//
//cudacore:gil release
func NoopReleased(ms int) (int, error) {
	return guard("cudacore.noop_released", func() (int, error) {
		if ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		return ms, nil
	})
}

var profile struct {
	mu   sync.Mutex
	file *os.File
}

// ProfileCPU starts a CPU profile of this process's Go code (runtime/pprof) written to path, or, given
// "", stops the one running and closes its file. It is a developer's tool for the hot paths on the GPU
// machine (scripts/gpu/profile.py); samples in C (Python, the driver) show as external code. Starting a
// second profile is an IllegalState error. It returns 0.
//
//cudacore:gil release
func ProfileCPU(path string) (int, error) {
	return guard("cudacore.profile_cpu", func() (int, error) {
		profile.mu.Lock()
		defer profile.mu.Unlock()
		if path == "" {
			if profile.file == nil {
				return 0, nil
			}
			pprof.StopCPUProfile()
			err := profile.file.Close()
			profile.file = nil
			return 0, err
		}
		if profile.file != nil {
			return 0, cuda.NewError("cudacore.profile_cpu", cuda.ErrorIllegalState, "a CPU profile is running already; stop it first")
		}
		f, err := os.Create(path)
		if err != nil {
			return 0, cuda.NewError("cudacore.profile_cpu", cuda.ErrorInvalidValue, err.Error())
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return 0, cuda.NewError("cudacore.profile_cpu", cuda.ErrorIllegalState, err.Error())
		}
		profile.file = f
		return 0, nil
	})
}

var goStacks struct {
	mu    sync.Mutex
	timer *time.Timer
}

// GoStacksAfter arms, for ms > 0, a one-shot timer that writes the stack of every goroutine to the
// process's standard error when it fires, or disarms it for ms <= 0 (arming again replaces the timer).
// It is the Go half of a hang report, which a stalled Python cannot ask for: the timer runs on its own
// goroutine, whatever holds the GIL, and the stacks show where Go code, and calls into the driver (as
// cgo calls), are waiting. Python's faulthandler writes the other half. It returns 0.
//
//cudacore:gil hold
func GoStacksAfter(ms int) (int, error) {
	return guard("cudacore.testing.go_stacks_after", func() (int, error) {
		goStacks.mu.Lock()
		defer goStacks.mu.Unlock()
		if goStacks.timer != nil {
			goStacks.timer.Stop()
			goStacks.timer = nil
		}
		if ms > 0 {
			goStacks.timer = time.AfterFunc(time.Duration(ms)*time.Millisecond, writeGoStacks)
		}
		return 0, nil
	})
}

func writeGoStacks() {
	buf := make([]byte, 4<<20)
	n := runtime.Stack(buf, true)
	fmt.Fprintf(os.Stderr, "cudacore: the stacks of every goroutine, %s:\n%s\n", time.Now().Format(time.RFC3339Nano), buf[:n])
	writeThreadStates(os.Stderr)
}

// threadSample is one thread of the process as /proc shows it.
type threadSample struct {
	name, state, wchan string
	cpuTicks           int64 // user + system time, in clock ticks
}

// sampleThreads reads every thread of the process from /proc/self/task (Linux); nil elsewhere.
func sampleThreads() map[string]threadSample {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	out := make(map[string]threadSample, len(tasks))
	for _, t := range tasks {
		dir := "/proc/self/task/" + t.Name() + "/"
		stat, err := os.ReadFile(dir + "stat")
		if err != nil {
			continue
		}
		// pid (comm) state ... with utime and stime the 14th and 15th fields; comm may hold spaces.
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		wchan, _ := os.ReadFile(dir + "wchan")
		out[t.Name()] = threadSample{name: string(stat[open+1 : end]), state: fields[0], wchan: string(wchan), cpuTicks: utime + stime}
	}
	return out
}

// writeThreadStates writes, for every thread of the process, its state, where the kernel has it wait,
// and how much CPU it used over a short interval: of a thread stuck in a driver call, it tells a spin in
// user space (busy, state R) from a sleep in the kernel (idle, state S or D, with the kernel function).
func writeThreadStates(w io.Writer) {
	const interval = 200 * time.Millisecond
	before := sampleThreads()
	if before == nil {
		return
	}
	time.Sleep(interval)
	after := sampleThreads()
	tids := make([]string, 0, len(after))
	for tid := range after {
		tids = append(tids, tid)
	}
	sort.Strings(tids)
	var b strings.Builder
	fmt.Fprintf(&b, "cudacore: the threads of the process (CPU ticks used over %v):\n", interval)
	for _, tid := range tids {
		a := after[tid]
		busy := int64(-1)
		if p, ok := before[tid]; ok {
			busy = a.cpuTicks - p.cpuTicks
		}
		wchan := a.wchan
		if wchan == "" || wchan == "0" {
			wchan = "-"
		}
		fmt.Fprintf(&b, "  thread %s %-16s state %s  waits in %-28s  cpu %d\n", tid, a.name, a.state, wchan, busy)
	}
	fmt.Fprint(w, b.String())
}
