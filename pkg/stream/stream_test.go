package stream

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

type env struct {
	drv   *cudasim.Driver
	dev   *device.Device
	stack *memory.Stack
	m     *Manager
	pins  map[uintptr]int
	mu    sync.Mutex
}

// newEnv opens device 0 of a fresh simulator with an allocator stack and a Manager whose staging
// buffers are small, so that copies span several of them, and that stages every pageable asynchronous
// copy (none goes to the driver's own pageable copy; TestPageableDirectMax covers that split).
func newEnv(t *testing.T, cfgs ...cudasim.DeviceConfig) *env {
	t.Helper()
	var opts []cudasim.Option
	if len(cfgs) > 0 {
		opts = append(opts, cudasim.WithDevices(cfgs...))
	}
	sim := cudasim.New(opts...)
	return newEnvOn(t, sim, sim)
}

// newEnvOn is newEnv on drv, a driver wrapping sim (a test's hooks).
func newEnvOn(t *testing.T, sim *cudasim.Driver, drv cuda.Driver) *env {
	t.Helper()
	e := &env{drv: sim, pins: map[uintptr]int{}}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	e.dev = d
	e.stack, err = memory.NewStack(d, memory.StackOptions{})
	require.NoError(t, err)
	e.m = New(d, Options{
		Memory:            func() *memory.Stack { return e.stack },
		Staging:           StagingTuning{Chunk: 4096, Buffers: 2},
		PageableDirectMax: -1,
		IsPinned: func(p uintptr, n int) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			for base, size := range e.pins {
				if p >= base && p+uintptr(n) <= base+uintptr(size) {
					return true
				}
			}
			return false
		},
	})
	t.Cleanup(func() {
		assert.NoError(t, e.m.Close())
		_ = e.stack.Close()
		_ = d.Close()
	})
	return e
}

func (e *env) pinned(t *testing.T, n int) []byte {
	t.Helper()
	b, err := e.drv.MemHostAlloc(e.dev.Context(), uint64(n), 0)
	require.NoError(t, err)
	e.mu.Lock()
	e.pins[uintptr(unsafe.Pointer(&b[0]))] = n
	e.mu.Unlock()
	t.Cleanup(func() { _ = e.drv.MemFreeHost(e.dev.Context(), b) })
	return b
}

func (e *env) alloc(t *testing.T, n int) cuda.DevicePtr {
	t.Helper()
	p, err := e.drv.MemAlloc(e.dev.Context(), uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.drv.MemFree(e.dev.Context(), p) })
	return p
}

func (e *env) stream(t *testing.T, nonBlocking bool) *Stream {
	t.Helper()
	s, err := e.m.Create(nonBlocking, 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Destroy()) })
	return s
}

// pattern returns n bytes that differ with seed and from one 256-byte block to the next (so that a chunk
// of a staged copy landing at the wrong offset, or another chunk's bytes, shows).
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ byte((i>>8)*131) ^ byte((i>>16)*73) ^ seed
	}
	return b
}

func requireResult(t *testing.T, want cuda.Result, err error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	assert.Equal(t, want, cuda.ResultOf(err), append([]any{"%v"}, err)...)
}

var modes = []cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal, cuda.CaptureModeRelaxed}

func TestCreatePriorityClamped(t *testing.T) {
	e := newEnv(t)
	least, great, err := e.m.PriorityRange()
	require.NoError(t, err)
	for _, tc := range []struct{ in, want int }{{0, 0}, {-3, -3}, {10, least}, {-100, great}} {
		s, err := e.m.Create(true, tc.in)
		require.NoError(t, err)
		assert.Equal(t, tc.want, s.Priority(), "priority %d", tc.in)
		require.NoError(t, s.Destroy())
		require.NoError(t, s.Destroy(), "idempotent")
		requireResult(t, cuda.ErrorClosed, s.Synchronize(), "a destroyed stream is a closed object")
	}
	assert.NoError(t, e.m.Legacy().Destroy(), "the default streams are never destroyed")
	assert.NoError(t, e.m.PerThread().Synchronize())
}

func TestCopiesSyncAndAsync(t *testing.T) {
	e := newEnv(t)
	const n = 3*4096 + 100 // spans several staging buffers
	a, b := e.alloc(t, n), e.alloc(t, n)
	s := e.stream(t, true)
	for _, tc := range []struct {
		name   string
		stream *Stream
		pinned bool
	}{{"sync pageable", nil, false}, {"sync pinned", nil, true}, {"async pageable", s, false}, {"async pinned", s, true}} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := pattern(n, 0x5a), make([]byte, n)
			if tc.pinned {
				p, q := e.pinned(t, n), e.pinned(t, n)
				copy(p, src)
				src, dst = p, q
			}
			want := bytes.Clone(src)
			require.NoError(t, e.m.CopyHtoD(a, src, tc.stream))
			require.NoError(t, e.m.CopyDtoD(b, a, n, tc.stream))
			require.NoError(t, e.m.CopyDtoH(dst, b, tc.stream))
			if tc.stream != nil {
				require.NoError(t, tc.stream.Synchronize())
			}
			assert.True(t, bytes.Equal(want, dst))
		})
	}
	allocated, _ := e.m.StagingStats()
	assert.LessOrEqual(t, allocated, 2, "the staging pool stays bounded")
}

func TestCaptureReplay(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	const n = 8192
	in, out := e.pinned(t, n), e.pinned(t, n)
	a, b := e.alloc(t, n), e.alloc(t, n)
	s := e.stream(t, false)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	assert.True(t, s.Capturing())
	require.NoError(t, e.m.CopyHtoD(a, in, s))
	require.NoError(t, e.m.CopyDtoD(b, a, n, s))
	require.NoError(t, e.m.CopyDtoH(out, b, s))
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.False(t, s.Capturing())
	assert.Equal(t, 3, g.NodeCount())
	require.NoError(t, g.Upload(s))
	for i := range 200 {
		want := pattern(n, byte(i))
		copy(in, want)
		require.NoError(t, g.Launch(s))
		require.NoError(t, s.Synchronize())
		require.True(t, bytes.Equal(want, out), "launch %d", i)
	}
	// Update from an identical capture.
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	require.NoError(t, e.m.CopyHtoD(a, in, s))
	require.NoError(t, e.m.CopyDtoD(b, a, n, s))
	require.NoError(t, e.m.CopyDtoH(out, b, s))
	g2, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Update(g2))
	// A graph updated from itself, and two graphs updating from each other on two goroutines at once,
	// never deadlock (each update holds both graphs' locks, taken in one order).
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, g.Update(g))
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(2)
			go func() { defer wg.Done(); assert.NoError(t, g.Update(g2)) }()
			go func() { defer wg.Done(); assert.NoError(t, g2.Update(g)) }()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("graph updates deadlocked")
	}
	require.NoError(t, g2.Destroy())
	requireResult(t, cuda.ErrorClosed, g.Update(g2), "update from a destroyed graph")

	require.NoError(t, g.Destroy())
	require.NoError(t, g.Destroy(), "idempotent")
	requireResult(t, cuda.ErrorClosed, g.Launch(s), "launch after destroy never reaches the driver")
	requireResult(t, cuda.ErrorClosed, g.Upload(s))
}

// TestIllegalDuringCapture runs every operation that capture forbids, in every mode, on a blocking
// capturing stream: each is refused with its CaptureError before the driver sees it (or allowed where
// the mode allows it), and afterwards the capture still ends with a graph and the stream works.
func TestIllegalDuringCapture(t *testing.T) {
	type op struct {
		name    string
		want    cuda.Result // Success: allowed
		relaxed cuda.Result // in RELAXED mode
		run     func(e *env, s, other *Stream, pin, page []byte, p cuda.DevicePtr) error
	}
	ops := []op{
		{"sync DtoH", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CopyDtoH(page, p, nil)
		}},
		{"sync HtoD", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CopyHtoD(p, pin, nil)
		}},
		{"sync DtoD", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CopyDtoD(p, p, 16, nil)
		}},
		{"pageable async HtoD", cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureUnsupported, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CopyHtoD(p, page, s)
		}},
		{"pageable async DtoH", cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureUnsupported, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CopyDtoH(page, p, s)
		}},
		{"synchronize the capturing stream", cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureUnsupported, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return s.Synchronize()
		}},
		{"query the capturing stream", cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureUnsupported, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			_, err := s.Query()
			return err
		}},
		{"synchronize another stream", cuda.ErrorStreamCaptureUnsupported, cuda.Success, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return o.Synchronize()
		}},
		{"synchronize the legacy stream", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.Legacy().Synchronize()
		}},
		{"synchronize the device", cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureUnsupported, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			_, err := e.m.SynchronizeDevice(0, true)
			return err
		}},
		{"record on the legacy stream", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			ev, err := e.m.NewEvent(false)
			if err != nil {
				return err
			}
			defer ev.Destroy()
			return ev.Record(nil)
		}},
		{"wait on an event recorded in the capture", cuda.ErrorCapturedEvent, cuda.ErrorCapturedEvent, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			ev, err := e.m.NewEvent(true)
			if err != nil {
				return err
			}
			defer ev.Destroy()
			if err := ev.Record(s); err != nil {
				return err
			}
			return ev.Synchronize()
		}},
		{"allocate on the legacy stream", cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureImplicit, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			return e.m.CheckAllocate(cuda.StreamLegacy)
		}},
		{"pinned async copies", cuda.Success, cuda.Success, func(e *env, s, o *Stream, pin, page []byte, p cuda.DevicePtr) error {
			if err := e.m.CopyHtoD(p, pin, s); err != nil {
				return err
			}
			return e.m.CopyDtoH(pin, p, s)
		}},
	}
	for _, mode := range modes {
		for _, o := range ops {
			t.Run(ModeName(mode)+"/"+o.name, func(t *testing.T) {
				// Each subtest runs on its own goroutine: the parent's locked thread is not its thread.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				e := newEnv(t)
				s, other := e.stream(t, false), e.stream(t, true)
				pin, page := e.pinned(t, 4096), make([]byte, 4096)
				p := e.alloc(t, 4096)
				require.NoError(t, s.BeginCapture(mode))
				err := o.run(e, s, other, pin, page, p)
				want := o.want
				if mode == cuda.CaptureModeRelaxed {
					want = o.relaxed
				}
				if want == cuda.Success {
					require.NoError(t, err)
				} else {
					requireResult(t, want, err)
					assert.ErrorIs(t, err, cuda.ErrCapture)
					var ce *cuda.Error
					require.ErrorAs(t, err, &ce)
					assert.Contains(t, ce.Op, "cudacore.")
					assert.NotEmpty(t, ce.Msg)
				}
				assert.True(t, s.Capturing(), "refused before the driver: the capture goes on")
				g, err := s.EndCapture()
				require.NoError(t, err, "the capture was never invalidated")
				require.NoError(t, g.Destroy())
				// The stream works again.
				require.NoError(t, e.m.CopyHtoD(p, pattern(4096, 3), s))
				require.NoError(t, e.m.CopyDtoH(page, p, s))
				require.NoError(t, s.Synchronize())
				assert.Equal(t, pattern(4096, 3), page)
			})
		}
	}
}

// TestDriverFailureEndsCapture: where the driver itself fails with a capture error, cudacore ends the
// capture, the stream works again, and EndCapture reports the first failing operation.
func TestDriverFailureEndsCapture(t *testing.T) {
	for _, code := range []cuda.Result{cuda.ErrorStreamCaptureImplicit, cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureInvalidated} {
		for _, mode := range modes {
			t.Run(ModeName(mode)+"/"+code.String(), func(t *testing.T) {
				// Each subtest runs on its own goroutine: the parent's locked thread is not its thread.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				e := newEnv(t)
				s := e.stream(t, true)
				pin := e.pinned(t, 4096)
				p := e.alloc(t, 4096)
				require.NoError(t, s.BeginCapture(mode))
				require.NoError(t, e.m.CopyHtoD(p, pin, s))
				e.drv.InjectFault("cuMemcpyDtoDAsync_v2", 1, code)
				err := e.m.CopyDtoD(p, p, 16, s)
				requireResult(t, code, err)
				assert.Contains(t, err.Error(), "ended the capture")
				assert.False(t, s.Capturing())
				require.NoError(t, e.m.CopyHtoD(p, pin, s), "the stream works again")
				_, err = s.EndCapture()
				requireResult(t, code, err)
				assert.Contains(t, err.Error(), "first failing operation, copy")
				_, err = s.EndCapture()
				requireResult(t, cuda.ErrorIllegalState, err, "the failure is reported once")
				require.NoError(t, s.Synchronize())
				assert.Zero(t, e.m.Registry().Active())
			})
		}
	}
}

func TestBadInput(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	requireResult(t, cuda.ErrorStreamCaptureUnsupported, e.m.Legacy().BeginCapture(cuda.CaptureModeGlobal))
	requireResult(t, cuda.ErrorStreamCaptureUnsupported, e.m.PerThread().BeginCapture(cuda.CaptureModeGlobal))
	s := e.stream(t, true)
	_, err := s.EndCapture()
	requireResult(t, cuda.ErrorIllegalState, err, "ending a capture never begun")
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	requireResult(t, cuda.ErrorIllegalState, s.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, s.AbortCapture())
	assert.False(t, s.Capturing())
	_, err = ParseMode("bogus")
	requireResult(t, cuda.ErrorInvalidValue, err)

	// A capture destroyed with its stream leaves nothing registered.
	s2, err := e.m.Create(false, 0)
	require.NoError(t, err)
	require.NoError(t, s2.BeginCapture(cuda.CaptureModeGlobal))
	require.NoError(t, s2.Destroy())
	assert.Zero(t, e.m.Registry().Active())
	require.NoError(t, e.m.Legacy().Synchronize())
}

// A THREAD_LOCAL or GLOBAL capture is ended or aborted only on the thread that began it: elsewhere both
// are refused with 908 and the capture goes on, in cudacore's books as at the driver (an abort that
// forgot the capture left the driver's stream capturing, so that every later synchronize failed).
func TestEndCaptureWrongThread(t *testing.T) {
	for _, mode := range []cuda.CaptureMode{cuda.CaptureModeThreadLocal, cuda.CaptureModeGlobal} {
		t.Run(ModeName(mode), func(t *testing.T) {
			e := newEnv(t)
			s := e.stream(t, true)
			began, abort, aborted := make(chan struct{}), make(chan struct{}), make(chan error)
			go func() {
				runtime.LockOSThread() // held until done, so this OS thread is not the test's
				defer runtime.UnlockOSThread()
				assert.NoError(t, s.BeginCapture(mode))
				close(began)
				<-abort
				aborted <- s.AbortCapture()
			}()
			<-began
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			_, err := s.EndCapture()
			requireResult(t, cuda.ErrorStreamCaptureWrongThread, err)
			assert.True(t, s.Capturing())
			requireResult(t, cuda.ErrorStreamCaptureWrongThread, s.AbortCapture())
			assert.True(t, s.Capturing())
			st, err := e.drv.StreamIsCapturing(e.dev.Context(), s.Handle())
			require.NoError(t, err)
			assert.Equal(t, cuda.CaptureStatusActive, st, "the driver goes on capturing too")

			close(abort)
			require.NoError(t, <-aborted, "the thread that began it aborts it")
			assert.False(t, s.Capturing())
			st, err = e.drv.StreamIsCapturing(e.dev.Context(), s.Handle())
			require.NoError(t, err)
			assert.Equal(t, cuda.CaptureStatusNone, st)
			require.NoError(t, s.Synchronize())
		})
	}
}

func TestTwoCapturesAtOnce(t *testing.T) {
	e := newEnv(t)
	const n = 4096
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			s, err := e.m.Create(true, 0)
			if !assert.NoError(t, err) {
				return
			}
			defer s.Destroy()
			in, out := e.pinned(t, n), e.pinned(t, n)
			p := e.alloc(t, n)
			if !assert.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal)) {
				return
			}
			assert.NoError(t, e.m.CopyHtoD(p, in, s))
			assert.NoError(t, e.m.CopyDtoH(out, p, s))
			g, err := s.EndCapture()
			if !assert.NoError(t, err) {
				return
			}
			defer g.Destroy()
			for r := range 20 {
				want := pattern(n, byte(16*i+r))
				copy(in, want)
				assert.NoError(t, g.Launch(s))
				assert.NoError(t, s.Synchronize())
				assert.Equal(t, want, out)
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, e.m.Registry().Active())
}

func TestAllocationInCapture(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	for _, size := range []uint64{1 << 20, 3 << 20} {
		require.NoError(t, e.m.CheckAllocate(s.Handle()))
		p, err := e.stack.Allocate(size, s.Handle())
		require.NoError(t, err)
		e.m.NoteAllocate(s.Handle(), p, size)
		assert.True(t, e.m.GraphMemory(s.Handle(), p), "an allocation of the capture is its graph memory")
		assert.False(t, e.m.GraphMemory(s.Handle(), p+1), "only the allocations themselves")
		require.NoError(t, e.m.CopyDtoD(p, p, 16, s))
	}
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.False(t, e.m.GraphMemory(s.Handle(), 0), "no capture: nothing is graph memory")
	assert.Equal(t, uint64(4<<20), g.MemoryHeld())
	assert.Equal(t, 2, g.Allocations())
	assert.GreaterOrEqual(t, g.NodeCount(), 4, "allocation nodes and copies")
	require.NoError(t, g.Destroy())
}

func TestSyncStrategyRefusesAllocationInCapture(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cfg := cudasim.H100()
	cfg.MemoryPoolsSupported = false
	e := newEnv(t, cfg)
	require.Equal(t, device.StrategySync, e.dev.Strategy())
	for _, mode := range modes {
		s := e.stream(t, true)
		require.NoError(t, s.BeginCapture(mode))
		err := e.m.CheckAllocate(s.Handle())
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, err)
		assert.Contains(t, err.Error(), "allocate before capture")
		err = e.m.CheckAllocate(0)
		if mode == cuda.CaptureModeRelaxed {
			assert.NoError(t, err, "relaxed captures allow synchronous allocation elsewhere")
		} else {
			requireResult(t, cuda.ErrorStreamCaptureUnsupported, err)
		}
		require.NoError(t, s.AbortCapture())
	}
	assert.NoError(t, e.m.CheckAllocate(0))
}

func TestEvents(t *testing.T) {
	e := newEnv(t)
	s := e.stream(t, true)
	a, err := e.m.NewEvent(true)
	require.NoError(t, err)
	defer a.Destroy()
	b, err := e.m.NewEvent(true)
	require.NoError(t, err)
	defer b.Destroy()
	_, err = b.ElapsedTime(a)
	requireResult(t, cuda.ErrorInvalidHandle, err, "not recorded")
	require.NoError(t, s.Record(a))
	time.Sleep(2 * time.Millisecond)
	require.NoError(t, s.Record(b))
	require.NoError(t, b.Synchronize())
	done, err := b.Query()
	require.NoError(t, err)
	assert.True(t, done)
	ms, err := b.ElapsedTime(a)
	require.NoError(t, err)
	assert.Greater(t, ms, float32(1))
	other := e.stream(t, true)
	require.NoError(t, other.WaitEvent(b))
	ok, err := other.Wait(50 * time.Millisecond)
	require.NoError(t, err)
	assert.True(t, ok)
	nt, err := e.m.NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, nt.Record(s))
	_, err = nt.ElapsedTime(a)
	requireResult(t, cuda.ErrorInvalidHandle, err, "no timing")
	require.NoError(t, nt.Destroy())
	require.NoError(t, nt.Destroy())
	requireResult(t, cuda.ErrorClosed, nt.Record(s), "a destroyed event is a closed object")
	done, err = e.m.SynchronizeDevice(50*time.Millisecond, true)
	require.NoError(t, err)
	assert.True(t, done)
}

// A destroyed stream's handle never reaches the driver again (the real driver segfaults on one): a free
// recorded against it goes to the legacy stream, an allocation on it is refused, and a new stream that
// reuses the handle is live again.
func TestDestroyedStreamHandleIsNeverUsed(t *testing.T) {
	e := newEnv(t)
	m := e.m
	// A block cached on the stream before it is destroyed goes back with it (ReleaseStream).
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	p, err := e.stack.Allocate(1<<20, s.Handle())
	require.NoError(t, err)
	require.NoError(t, e.stack.Deallocate(p, 1<<20, s.Handle()))
	require.NoError(t, s.Destroy())
	s, err = m.Create(true, 0)
	require.NoError(t, err)
	h := s.Handle()
	assert.Equal(t, h, m.UseForFree(h))
	m.Done(h)
	require.NoError(t, m.UseForAlloc(h))
	m.Done(h)

	require.NoError(t, s.Destroy())
	assert.Equal(t, cuda.StreamLegacy, m.UseForFree(h), "a free on a destroyed stream is ordered on the legacy stream")
	m.Done(h)
	err = m.UseForAlloc(h)
	assert.ErrorIs(t, err, cuda.ErrInvalidHandle)
	assert.Contains(t, err.Error(), "was destroyed")
	for _, def := range []cuda.Stream{0, cuda.StreamLegacy, cuda.StreamPerThread} {
		assert.Equal(t, def, m.UseForFree(def))
		m.Done(def)
	}
	require.NoError(t, e.stack.Release(), "nothing is cached against a destroyed stream")
}

// One transient failure of the priority query fails that one stream creation, not every later one.
func TestPriorityRangeFailureIsNotRemembered(t *testing.T) {
	e := newEnv(t)
	e.drv.InjectFault("cuCtxGetStreamPriorityRange", 1, cuda.ErrorUnknown)
	_, err := e.m.Create(true, 0)
	requireResult(t, cuda.ErrorUnknown, err, "the injected failure")
	s, err := e.m.Create(true, 0)
	require.NoError(t, err, "the next creation reads the range again")
	require.NoError(t, s.Destroy())
}

// A transient failure of cuStreamEndCapture leaves the driver's stream capturing: cudacore keeps the
// capture too, so that ending it again works (it used to forget it, and the next free failed and leaked).
func TestFailedEndCaptureKeepsTheCapture(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	e.drv.InjectFault("cuStreamEndCapture", 1, cuda.ErrorUnknown)
	_, err := s.EndCapture()
	requireResult(t, cuda.ErrorUnknown, err, "the injected failure")
	assert.True(t, s.Capturing(), "the driver's stream still captures, and cudacore knows it")
	g, err := s.EndCapture()
	require.NoError(t, err, "ending it again works")
	assert.False(t, s.Capturing())
	require.NoError(t, g.Destroy())
}

// A failed destroy of a graph is retried by the next Destroy (issue: it was marked destroyed first and
// its driver objects leaked); meanwhile the graph refuses launches.
func TestGraphDestroyFailureIsRetried(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	a := e.alloc(t, 64)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	require.NoError(t, e.m.CopyDtoD(a, a, 64, s))
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Launch(s), "instantiates the executable graph")
	e.drv.InjectFault("cuGraphExecDestroy", 1, cuda.ErrorUnknown)
	requireResult(t, cuda.ErrorUnknown, g.Destroy(), "the injected failure")
	assert.True(t, g.Destroyed())
	requireResult(t, cuda.ErrorClosed, g.Launch(s), "a graph being destroyed is not launched")
	require.NoError(t, g.Destroy(), "the retry destroys what is left")
	require.NoError(t, g.Destroy(), "idempotent afterwards")
}

// A synchronize or query racing Destroy on another goroutine (Python releases the GIL for them) either
// completes before the handle goes or reports the closed stream: a destroyed handle never reaches the
// driver, where the simulator would end the process.
func TestWaitsRacingDestroyNeverUseADeadHandle(t *testing.T) {
	e := newEnv(t)
	for range 200 {
		s := e.stream(t, true)
		ev, err := e.m.NewEvent(false)
		require.NoError(t, err)
		require.NoError(t, ev.Record(s))
		var wg sync.WaitGroup
		wg.Add(4)
		go func() { defer wg.Done(); _ = s.Synchronize() }()
		go func() { defer wg.Done(); _, _ = s.Wait(time.Millisecond) }()
		go func() { defer wg.Done(); _, _ = ev.Query() }()
		go func() {
			defer wg.Done()
			assert.NoError(t, s.Destroy())
			assert.NoError(t, ev.Destroy())
		}()
		wg.Wait()
	}
}

// The escape audit: work cudacore runs at once while a capture is in progress (on another stream, or
// synchronously) is listed by the graph; work on the capturing stream, and work after the capture, is not.
func TestCaptureEscapes(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	const n = 4096
	in := e.pinned(t, n)
	a, b := e.alloc(t, n), e.alloc(t, n)
	s, other := e.stream(t, true), e.stream(t, true)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, e.m.CopyHtoD(a, in, s))       // captured
	require.NoError(t, e.m.CopyDtoD(b, a, n, nil))   // synchronous: runs now
	require.NoError(t, e.m.CopyDtoD(b, a, n, other)) // another stream: runs now
	e.m.NoteEscape("allocate", other.Handle())       // as the allocation path reports one
	e.m.NoteEscape("allocate", s.Handle())           // on the capturing stream: in the graph
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, e.m.CopyDtoD(b, a, n, other)) // after the capture: no escape
	list, count := g.Escapes()
	assert.Equal(t, 3, count)
	require.Len(t, list, 3)
	assert.Equal(t, "copy (synchronous) on device 0", list[0])
	assert.Equal(t, "copy on "+other.String(), list[1])
	assert.Equal(t, "allocate on "+other.String(), list[2])
	assert.Equal(t, 1, g.NodeCount())
	require.NoError(t, g.Destroy())
}

// The escape audit lists the capturing thread's work only: another thread's copies on its own streams, and
// its synchronous ones, made while the capture runs, are none of the capture's business.
func TestCaptureEscapesAreTheCapturingThreadsOwn(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	const n = 4096
	a, b := e.alloc(t, n), e.alloc(t, n)
	s, other, mine := e.stream(t, true), e.stream(t, true), e.stream(t, true)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // another OS thread, as another Python thread is
		defer runtime.UnlockOSThread()
		assert.NoError(t, e.m.CopyDtoD(b, a, n, other))
		assert.NoError(t, e.m.CopyDtoD(b, a, n, nil))
		e.m.NoteEscape("allocate", other.Handle())
	}()
	<-done
	require.NoError(t, e.m.CopyDtoD(b, a, n, mine)) // the capturing thread's own: an escape
	g, err := s.EndCapture()
	require.NoError(t, err)
	list, count := g.Escapes()
	assert.Equal(t, 1, count, "%v", list)
	assert.Equal(t, []string{"copy on " + mine.String()}, list)
	require.NoError(t, g.Destroy())
}

// Destroying an executable graph is an unsafe call during a capture: the driver refuses it with 900 and
// invalidates the capture, in GLOBAL mode from any thread and in THREAD_LOCAL mode from the capturing
// thread. Graph.Destroy therefore waits for the captures to end where the call is forbidden, and
// destroys at once where it is allowed; in every case the capture in progress survives.
func TestGraphDestroyedDuringACaptureLeavesItValid(t *testing.T) {
	for _, mode := range modes {
		for _, otherThread := range []bool{false, true} {
			name := ModeName(mode) + map[bool]string{false: "/same thread", true: "/other thread"}[otherThread]
			t.Run(name, func(t *testing.T) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				e := newEnv(t)
				s, other := e.stream(t, true), e.stream(t, true)
				a := e.alloc(t, 64)
				g, p := e.unlaunchedGraphMemory(t, other)

				require.NoError(t, s.BeginCapture(mode))
				require.NoError(t, e.m.CopyDtoD(a, a, 64, s))
				if otherThread {
					done := make(chan error)
					go func() {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						done <- g.Destroy()
					}()
					require.NoError(t, <-done)
				} else {
					require.NoError(t, g.Destroy())
				}
				assert.True(t, g.Destroyed())
				requireResult(t, cuda.ErrorClosed, g.Launch(other), "a destroyed graph is not launched")
				forbidden := mode == cuda.CaptureModeGlobal || mode == cuda.CaptureModeThreadLocal && !otherThread
				if forbidden {
					assert.Empty(t, e.m.TakeVoided(), "the destroy waits for the capture to end")
				} else {
					assert.Equal(t, []cuda.DevicePtr{p}, voidedPtrs(e.m.TakeVoided()), "allowed here: destroyed at once")
				}
				captured, err := s.EndCapture()
				require.NoError(t, err, "the capture survived the destroy")
				require.NoError(t, captured.Destroy())
				if forbidden {
					assert.Equal(t, []cuda.DevicePtr{p}, voidedPtrs(e.m.TakeVoided()), "destroyed once the capture ended")
				}
				require.NoError(t, g.Destroy(), "idempotent")
				assert.Zero(t, e.m.Registry().Deferred())
			})
		}
	}
}

// Aborting a capture destroys the graph the driver hands back: with a GLOBAL capture in progress on
// another stream, that destroy waits for it to end rather than invalidate it.
func TestAbortDuringAGlobalCaptureLeavesItValid(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, other := e.stream(t, true), e.stream(t, true)
	a := e.alloc(t, 64)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeGlobal))
	require.NoError(t, e.m.CopyDtoD(a, a, 64, s))
	require.NoError(t, other.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, e.m.CopyDtoD(a, a, 64, other))
	require.NoError(t, other.AbortCapture())
	g, err := s.EndCapture()
	require.NoError(t, err, "the GLOBAL capture survived the other one's abort")
	require.NoError(t, g.Destroy())
	assert.Zero(t, e.m.Registry().Deferred())
}

// A capture neither begins nor ends while Steady runs (work made without the GIL that books an allocation
// by whether its stream captures: fuzzer seed 103919): between cudacore's registry and the driver, a tile
// allocated as BeginCapture ran was booked as graph memory while the driver made an ordinary allocation.
func TestNoCaptureBeginsOrEndsDuringSteady(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	for _, step := range []struct {
		name   string
		change func() error
		want   bool // whether s captures once the change is made
	}{
		{"begin", func() error { return s.BeginCapture(cuda.CaptureModeRelaxed) }, true},
		{"end", func() error { _, err := s.EndCapture(); return err }, false},
	} {
		in, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			_ = e.m.reg.Steady(func() error {
				close(in)
				<-release
				return nil
			})
		}()
		<-in
		go func() { done <- step.change() }()
		time.Sleep(50 * time.Millisecond) // the change would be made by now if nothing held it back
		assert.Equal(t, !step.want, s.Capturing(), "%s: held back while Steady runs", step.name)
		select {
		case err := <-done:
			t.Fatalf("%s: made during Steady (%v)", step.name, err)
		default:
		}
		close(release)
		require.NoError(t, <-done, step.name)
		assert.Equal(t, step.want, s.Capturing(), step.name)
	}
}

// unlaunchedGraphMemory captures on other, and instantiates, a graph holding 4 KiB of graph memory (at p)
// that no launch made real: destroying the graph makes that memory void.
func (e *env) unlaunchedGraphMemory(t *testing.T, other *Stream) (*Graph, cuda.DevicePtr) {
	t.Helper()
	require.NoError(t, other.BeginCapture(cuda.CaptureModeThreadLocal))
	p, err := e.stack.Allocate(4096, other.Handle())
	require.NoError(t, err)
	e.m.NoteAllocate(other.Handle(), p, 4096)
	g, err := other.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Instantiate())
	return g, p
}
