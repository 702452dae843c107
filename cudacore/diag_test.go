package cudacore

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A hang report's thread list tells a thread spinning in user space from one asleep in the kernel.
func TestThreadStatesTellBusyFromSleeping(t *testing.T) {
	if sampleThreads() == nil {
		t.Skip("no /proc/self/task here")
	}
	var stop atomic.Bool
	busy := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		busy <- syscall.Gettid()
		for !stop.Load() {
		}
	}()
	tid := <-busy
	defer stop.Store(true)

	var out bytes.Buffer
	writeThreadStates(&out)
	text := out.String()
	require.True(t, strings.HasPrefix(text, "cudacore: the threads of the process"), text)
	var line string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), fmt.Sprintf("thread %d ", tid)) {
			line = l
		}
	}
	require.NotEmpty(t, line, "the spinning thread %d is listed:\n%s", tid, text)
	assert.Contains(t, line, "state R", "a spinning thread runs")
	fields := strings.Fields(line)
	cpu, err := strconv.Atoi(fields[len(fields)-1])
	require.NoError(t, err, line)
	assert.Positive(t, cpu, "a thread that spun for the whole interval used CPU time: %s", line)
	assert.Contains(t, text, fmt.Sprintf("thread %d ", syscall.Getpid()), "the main thread is listed")
}
