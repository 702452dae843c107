package stream

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// drainingSim is the simulator with the real driver's per-thread drain: it counts the requests.
type drainingSim struct {
	*cudasim.Driver
	mu    sync.Mutex
	asked map[cuda.Context]int
}

func (d *drainingSim) DrainPerThreadAtExit(ctx cuda.Context) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked[ctx]++
	return true
}

func (d *drainingSim) count(ctx cuda.Context) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[ctx]
}

// Every use of the per-thread default stream, and only of it, asks the driver to drain it when the
// calling thread exits: resolving it, queuing work on it, and freeing memory last used on it.
func TestPerThreadStreamUsesAskForADrainAtThreadExit(t *testing.T) {
	drv := &drainingSim{Driver: cudasim.New(), asked: map[cuda.Context]int{}}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	stack, err := memory.NewStack(d, memory.StackOptions{})
	require.NoError(t, err)
	m := New(d, Options{Memory: func() *memory.Stack { return stack }})
	own, err := m.Create(true, 0)
	require.NoError(t, err)
	ctx := d.Context()

	steps := []struct {
		name  string
		do    func()
		drain bool
	}{
		{"the legacy stream", func() { require.NoError(t, m.Use("copy", cuda.StreamLegacy)); m.Done(cuda.StreamLegacy) }, false},
		{"an own stream", func() { require.NoError(t, m.Use("copy", own.Handle())); m.Done(own.Handle()) }, false},
		{"a free on an own stream", func() { m.Done(m.UseForFree(own.Handle())) }, false},
		{"resolving the per-thread stream", func() { _ = m.PerThread() }, true},
		{"work on it", func() { require.NoError(t, m.Use("copy", cuda.StreamPerThread)); m.Done(cuda.StreamPerThread) }, true},
		{"an allocation on it", func() { require.NoError(t, m.UseForAlloc(cuda.StreamPerThread)); m.Done(cuda.StreamPerThread) }, true},
		{"a free on it", func() { m.Done(m.UseForFree(cuda.StreamPerThread)) }, true},
	}
	for _, s := range steps {
		before := drv.count(ctx)
		s.do()
		if s.drain {
			assert.Equal(t, before+1, drv.count(ctx), s.name)
		} else {
			assert.Equal(t, before, drv.count(ctx), s.name)
		}
	}
	require.NoError(t, m.PerThread().Synchronize(), "the per-thread stream works as before")
}
