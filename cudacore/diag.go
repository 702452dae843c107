package cudacore

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
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
}
