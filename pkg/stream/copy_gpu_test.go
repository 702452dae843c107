package stream

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// These need a real CUDA driver and GPU: they skip where libcuda.so.1 (or $CUDACORE_LIBCUDA) does not
// load or sees no device, so they run on the GPU machine and nowhere else.

type gpuEnv struct {
	drv cuda.Driver
	dev *device.Device
	m   *Manager
}

func openGPU(tb testing.TB) *gpuEnv {
	tb.Helper()
	d, err := libcuda.Open(libcuda.PathFromEnv())
	if err != nil {
		tb.Skipf("no CUDA driver here: %v", err)
	}
	if err := d.Init(); err != nil {
		tb.Skipf("cuInit failed (no usable GPU?): %v", err)
	}
	if n, err := d.DeviceCount(); err != nil || n == 0 {
		tb.Skip("the CUDA driver sees no device")
	}
	dev, err := device.Open(d, 0, "")
	require.NoError(tb, err)
	e := &gpuEnv{drv: d, dev: dev, m: New(dev, Options{})}
	tb.Cleanup(func() {
		assert.NoError(tb, e.m.Close())
		_ = dev.Close()
	})
	return e
}

func (e *gpuEnv) alloc(tb testing.TB, n int) cuda.DevicePtr {
	tb.Helper()
	p, err := e.drv.MemAlloc(e.dev.Context(), uint64(n))
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = e.drv.MemFree(e.dev.Context(), p) })
	return p
}

// TestGPUPageableCopy round-trips pageable memory at sizes around the default chunk, through the driver's
// own pageable copy up to PageableDirectMax and through the staged paths (with every copy staged too),
// reusing the source as soon as each call returns.
func TestGPUPageableCopy(t *testing.T) {
	e := openGPU(t)
	for _, direct := range []int{0, -1} {
		t.Run(fmt.Sprintf("PageableDirectMax=%d", direct), func(t *testing.T) {
			m := New(e.dev, Options{PageableDirectMax: direct})
			defer func() { assert.NoError(t, m.Close()) }()
			s, err := m.Create(true, 0)
			require.NoError(t, err)
			defer s.Destroy()
			for _, n := range []int{1, 64 << 10, DefaultCopyPiece - 1, DefaultCopyPiece, DefaultStagingSize - 1, DefaultStagingSize,
				DefaultStagingSize + 1, 3*DefaultStagingSize*DefaultStagingCount + 12345} {
				p := e.alloc(t, n)
				src := pattern(n, byte(n))
				want := bytes.Clone(src)
				require.NoError(t, m.CopyHtoD(p, src, s))
				clear(src)
				got := make([]byte, n)
				require.NoError(t, m.CopyDtoH(got, p, s))
				require.True(t, bytes.Equal(want, got), "n=%d", n)
				// and synchronously (staged above PageableDirectMax), into the same device range
				want = pattern(n, byte(n)+1)
				src = bytes.Clone(want)
				require.NoError(t, m.CopyHtoD(p, src, nil))
				clear(src)
				clear(got)
				require.NoError(t, m.CopyDtoH(got, p, nil))
				require.True(t, bytes.Equal(want, got), "synchronous, n=%d", n)
			}
			require.NoError(t, s.Synchronize())
		})
	}
}

// TestGPUSyncCopyFollowsBlockingStreams: a staged synchronous copy is ordered as the driver's own
// synchronous copy, after the work queued before it on blocking streams: its device-to-host half sees
// what a large asynchronous copy on a blocking stream, still in flight when it is called, wrote.
func TestGPUSyncCopyFollowsBlockingStreams(t *testing.T) {
	e := openGPU(t)
	blocking, err := e.m.Create(false, 0)
	require.NoError(t, err)
	defer blocking.Destroy()
	const n = 256 << 20
	p := e.alloc(t, n)
	pin, err := e.drv.MemHostAlloc(e.dev.Context(), n, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.drv.MemFreeHost(e.dev.Context(), pin)) }()
	for round := range 3 {
		want := pattern(n, byte(round))
		copy(pin, want)
		require.NoError(t, e.drv.MemcpyHtoDAsync(e.dev.Context(), p, pin, blocking.Handle()))
		got := make([]byte, n)
		require.NoError(t, e.m.CopyDtoH(got, p, nil))
		require.True(t, bytes.Equal(want, got), "round %d: the synchronous copy ran before the blocking stream's", round)
	}
}

// TestGPUSyncCopyOrder: a staged synchronous host-to-device copy reads its source only after the work
// queued before it on blocking streams (here, a device-to-host copy into that source: page-locked memory
// the manager does not know as pinned, so it is staged), and returns once the data has arrived: a read of
// the destination on a non-blocking stream, which follows no other stream, sees all of it.
func TestGPUSyncCopyOrder(t *testing.T) {
	e := openGPU(t)
	ctx := e.dev.Context()
	blocking, err := e.m.Create(false, 0)
	require.NoError(t, err)
	defer blocking.Destroy()
	other, err := e.m.Create(true, 0)
	require.NoError(t, err)
	defer other.Destroy()
	const n = 256 << 20
	a, q := e.alloc(t, n), e.alloc(t, n)
	foreign, err := e.drv.MemHostAlloc(ctx, n, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.drv.MemFreeHost(ctx, foreign)) }()
	out, err := e.drv.MemHostAlloc(ctx, n, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.drv.MemFreeHost(ctx, out)) }()
	for round := range 3 {
		want := pattern(n, byte(0x30+round))
		require.NoError(t, e.m.CopyHtoD(a, want, nil))
		copy(foreign, pattern(n, 0xEE)) // stale: the device-to-host copy below overwrites it
		require.NoError(t, e.drv.MemcpyDtoHAsync(ctx, foreign, a, blocking.Handle()))
		require.NoError(t, e.m.CopyHtoD(q, foreign, nil))
		require.NoError(t, e.drv.MemcpyDtoHAsync(ctx, out, q, other.Handle()))
		require.NoError(t, e.drv.StreamSynchronize(ctx, other.Handle()))
		require.True(t, bytes.Equal(want, out), "round %d: the copy read its source too early or returned too soon", round)
	}
}

// BenchmarkGPUCopyHtoD compares, copy plus synchronize, the driver's own pageable cuMemcpyHtoD with
// cudacore's staged pageable asynchronous copy, and the copy engine from pinned memory.
func BenchmarkGPUCopyHtoD(b *testing.B) {
	e := openGPU(b)
	s, err := e.m.Create(true, 0)
	require.NoError(b, err)
	defer s.Destroy()
	for _, n := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20} {
		p := e.alloc(b, n)
		src := pattern(n, 1)
		pin, err := e.drv.MemHostAlloc(e.dev.Context(), uint64(n), 0)
		require.NoError(b, err)
		copy(pin, src)
		b.Run(fmt.Sprintf("driver-pageable/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.drv.MemcpyHtoD(e.dev.Context(), p, src); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("cudacore-pageable/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.m.CopyHtoD(p, src, s); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("cudacore-pageable-sync/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.m.CopyHtoD(p, src, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("driver-pinned/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.drv.MemcpyHtoDAsync(e.dev.Context(), p, pin, s.Handle()); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
		require.NoError(b, e.drv.MemFreeHost(e.dev.Context(), pin))
	}
}

// BenchmarkGPUWait compares ways of waiting for a 16 MiB copy (copy plus wait per repetition): the
// driver's cuStreamSynchronize, Stream.Synchronize, and Stream.Wait in slices as Python waits.
func BenchmarkGPUWait(b *testing.B) {
	e := openGPU(b)
	s, err := e.m.Create(true, 0)
	require.NoError(b, err)
	defer s.Destroy()
	const n = 16 << 20
	p := e.alloc(b, n)
	src := pattern(n, 1)
	pin, err := e.drv.MemHostAlloc(e.dev.Context(), n, 0)
	require.NoError(b, err)
	defer func() { require.NoError(b, e.drv.MemFreeHost(e.dev.Context(), pin)) }()
	waits := []struct {
		name string
		wait func() error
	}{
		{"driver", func() error { return e.drv.StreamSynchronize(e.dev.Context(), s.Handle()) }},
		{"synchronize", s.Synchronize},
		{"wait", nil}, // Stream.Wait in 50 ms slices
	}
	for _, from := range []struct {
		name string
		b    []byte
	}{{"pinned", pin}, {"pageable", src}} {
		for _, w := range waits {
			b.Run(fmt.Sprintf("%s/%s", from.name, w.name), func(b *testing.B) {
				b.SetBytes(n)
				for b.Loop() {
					if err := e.m.CopyHtoD(p, from.b, s); err != nil {
						b.Fatal(err)
					}
					if w.wait != nil {
						if err := w.wait(); err != nil {
							b.Fatal(err)
						}
						continue
					}
					for {
						done, err := s.Wait(50 * time.Millisecond)
						if err != nil {
							b.Fatal(err)
						}
						if done {
							break
						}
					}
				}
			})
		}
	}
}

// BenchmarkGPUHostCopy measures the host half of a staged copy alone: 64 MiB of pageable memory copied by
// a crew into pinned memory, and into pageable memory, in chunks of the default size with the default
// piece, over 1 to 16 workers, with no DMA competing for host memory.
func BenchmarkGPUHostCopy(b *testing.B) {
	e := openGPU(b)
	const n = 64 << 20
	src := pattern(n, 1)
	pin, err := e.drv.MemHostAlloc(e.dev.Context(), n, 0)
	require.NoError(b, err)
	defer func() { require.NoError(b, e.drv.MemFreeHost(e.dev.Context(), pin)) }()
	plain := make([]byte, n)
	for _, w := range []int{1, 2, 4, 8, 16} {
		for _, dst := range []struct {
			name string
			b    []byte
		}{{"pinned", pin}, {"pageable", plain}} {
			b.Run(fmt.Sprintf("%s/w%d", dst.name, w), func(b *testing.B) {
				b.SetBytes(n)
				for b.Loop() {
					crewCopy(dst.b, src, StagingTuning{Workers: w}.withDefaults())
				}
			})
		}
	}
}

// BenchmarkGPUSyncCopy compares synchronous pageable copies both ways: the driver's own (cuMemcpyHtoD,
// cuMemcpyDtoH) and cudacore's, which stages those above PageableDirectMax.
func BenchmarkGPUSyncCopy(b *testing.B) {
	e := openGPU(b)
	ctx := e.dev.Context()
	for _, n := range []int{64 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 256 << 20} {
		p := e.alloc(b, n)
		host := pattern(n, 1)
		for _, c := range []struct {
			name string
			copy func() error
		}{
			{"htod/driver", func() error { return e.drv.MemcpyHtoD(ctx, p, host) }},
			{"htod/cudacore", func() error { return e.m.CopyHtoD(p, host, nil) }},
			{"dtoh/driver", func() error { return e.drv.MemcpyDtoH(ctx, host, p) }},
			{"dtoh/cudacore", func() error { return e.m.CopyDtoH(host, p, nil) }},
		} {
			b.Run(fmt.Sprintf("%dKiB/%s", n>>10, c.name), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					if err := c.copy(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkGPUTuning compares settings of the staged asynchronous copies, both ways (copy plus
// synchronize), beside the driver's own pageable copy (scripts/gpu/pageable_probe.py makes the same
// comparison from Python, through the installed wheel).
func BenchmarkGPUTuning(b *testing.B) {
	e := openGPU(b)
	settings := []struct {
		name string
		t    StagingTuning
	}{
		{"default", StagingTuning{}},
		{"c8m-b4-w8", StagingTuning{Chunk: 8 << 20, Buffers: 4, Workers: 8}},
		{"c4m-b8-w12", StagingTuning{Workers: 12}},
		{"c2m-b16-w8", StagingTuning{Chunk: 2 << 20, Buffers: 16}},
		{"c4m-b8-w8-p256k", StagingTuning{Piece: 256 << 10}},
		{"c4m-b8-w1", StagingTuning{Workers: 1}},
	}
	for _, n := range []int{16 << 20, 64 << 20, 256 << 20} {
		p := e.alloc(b, n)
		host := pattern(n, 1)
		b.Run(fmt.Sprintf("%dMiB/htod/driver", n>>20), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.drv.MemcpyHtoD(e.dev.Context(), p, host); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dMiB/dtoh/driver", n>>20), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.drv.MemcpyDtoH(e.dev.Context(), host, p); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, st := range settings {
			m := New(e.dev, Options{Staging: st.t})
			s, err := m.Create(true, 0)
			require.NoError(b, err)
			for _, dir := range []string{"htod", "dtoh"} {
				b.Run(fmt.Sprintf("%dMiB/%s/%s", n>>20, dir, st.name), func(b *testing.B) {
					b.SetBytes(int64(n))
					for b.Loop() {
						var err error
						if dir == "htod" {
							err = m.CopyHtoD(p, host, s)
						} else {
							err = m.CopyDtoH(host, p, s)
						}
						if err != nil {
							b.Fatal(err)
						}
						if err := s.Synchronize(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			require.NoError(b, s.Destroy())
			require.NoError(b, m.Close())
		}
	}
}

// baselineHtoD and baselineDtoH stage a copy one chunk at a time, as a comparison for the pipeline in
// BenchmarkGPUPipelineAB: each chunk's host copy is spread over goroutines started for it and waited for
// (its slowest piece paid per chunk), then the caller makes the chunk's driver calls while the goroutines
// are idle; device to host keeps one DMA ahead of the copy-out.
func baselineHtoD(m *Manager, dst cuda.DevicePtr, src []byte, s *Stream, piece, workers int) error {
	for off := 0; off < len(src); {
		buf, err := m.staging.get()
		if err != nil {
			return err
		}
		n := min(len(buf), len(src)-off)
		baselineHostCopy(buf[:n], src[off:off+n], piece, workers)
		if err := m.drv.MemcpyHtoDAsync(m.ctx, dst+cuda.DevicePtr(off), buf[:n], s.h); err != nil {
			m.staging.recycle(buf, 0)
			return err
		}
		if err := m.staging.put(buf, s); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func baselineDtoH(m *Manager, dst []byte, src cuda.DevicePtr, s *Stream, piece, workers int) error {
	type chunk struct {
		buf    []byte
		ev     cuda.Event
		off, n int
	}
	land := func(c chunk) error {
		if err := m.drv.EventSynchronize(m.ctx, c.ev); err != nil {
			return err
		}
		baselineHostCopy(dst[c.off:c.off+c.n], c.buf[:c.n], piece, workers)
		m.staging.recycle(nil, c.ev)
		return nil
	}
	var prev *chunk
	for off := 0; off < len(dst); {
		buf, err := m.staging.poll()
		if err == nil && buf == nil {
			if prev != nil { // land the previous chunk and reuse its buffer
				if err := land(*prev); err != nil {
					return err
				}
				buf, prev = prev.buf, nil
			} else {
				buf, err = m.staging.get()
			}
		}
		if err != nil {
			return err
		}
		n := min(len(buf), len(dst)-off)
		if err := m.drv.MemcpyDtoHAsync(m.ctx, buf[:n], src+cuda.DevicePtr(off), s.h); err != nil {
			return err
		}
		ev, err := m.staging.record(s)
		if err != nil {
			return err
		}
		if prev != nil {
			if err := land(*prev); err != nil {
				return err
			}
			m.staging.recycle(prev.buf, 0)
		}
		prev = &chunk{buf, ev, off, n}
		off += n
	}
	if err := land(*prev); err != nil {
		return err
	}
	m.staging.recycle(prev.buf, 0)
	return nil
}

// baselineHostCopy copies src into dst over up to workers goroutines started for it, the caller one of
// them, in pieces claimed dynamically, and returns when all are copied.
func baselineHostCopy(dst, src []byte, piece, workers int) {
	pieces := (len(src) + piece - 1) / piece
	workers = min(workers, pieces, runtime.GOMAXPROCS(0))
	var next atomic.Int64
	var wg sync.WaitGroup
	work := func() {
		defer wg.Done()
		for {
			i := int(next.Add(1) - 1)
			if i >= pieces {
				return
			}
			lo := i * piece
			hi := min(lo+piece, len(src))
			copy(dst[lo:hi], src[lo:hi])
		}
	}
	wg.Add(workers)
	for range workers - 1 {
		go work()
	}
	work()
	wg.Wait()
}

// BenchmarkGPUPipelineAB compares, in one process, the pipeline against staging one chunk at a time
// (baselineHtoD, baselineDtoH) with the same pool, both ways, copy plus synchronize: "chunked" with 8
// MiB × 4 buffers, 8 goroutines and 256 KiB pieces, and with 1 MiB pieces (which separates the pieces'
// store type from the pipelining), against the pipeline's defaults and the driver's own pageable copy.
func BenchmarkGPUPipelineAB(b *testing.B) {
	e := openGPU(b)
	chunked := StagingTuning{Chunk: 8 << 20, Buffers: 4, Workers: 8}
	ways := []struct {
		name string
		t    StagingTuning
		htod func(m *Manager, dst cuda.DevicePtr, src []byte, s *Stream) error
		dtoh func(m *Manager, dst []byte, src cuda.DevicePtr, s *Stream) error
	}{
		{"pipeline", StagingTuning{}, nil, nil},
		{"chunked-256k", chunked,
			func(m *Manager, d cuda.DevicePtr, h []byte, s *Stream) error {
				return baselineHtoD(m, d, h, s, 256<<10, 8)
			},
			func(m *Manager, h []byte, d cuda.DevicePtr, s *Stream) error {
				return baselineDtoH(m, h, d, s, 256<<10, 8)
			}},
		{"chunked-1m", chunked,
			func(m *Manager, d cuda.DevicePtr, h []byte, s *Stream) error {
				return baselineHtoD(m, d, h, s, 1<<20, 8)
			},
			func(m *Manager, h []byte, d cuda.DevicePtr, s *Stream) error {
				return baselineDtoH(m, h, d, s, 1<<20, 8)
			}},
	}
	for _, n := range []int{16 << 20, 64 << 20, 256 << 20} {
		p := e.alloc(b, n)
		host := pattern(n, 1)
		for _, w := range ways {
			m := New(e.dev, Options{Staging: w.t})
			s, err := m.Create(true, 0)
			require.NoError(b, err)
			for _, dir := range []string{"htod", "dtoh"} {
				b.Run(fmt.Sprintf("%dMiB/%s/%s", n>>20, dir, w.name), func(b *testing.B) {
					b.SetBytes(int64(n))
					for b.Loop() {
						var err error
						switch {
						case dir == "htod" && w.htod != nil:
							err = w.htod(m, p, host, s)
						case dir == "htod":
							err = m.CopyHtoD(p, host, s)
						case w.dtoh != nil:
							err = w.dtoh(m, host, p, s)
						default:
							err = m.CopyDtoH(host, p, s)
						}
						if err != nil {
							b.Fatal(err)
						}
						if err := s.Synchronize(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			require.NoError(b, s.Destroy())
			require.NoError(b, m.Close())
		}
	}
}

// BenchmarkGPUPipelineSplit times a staged host-to-device copy's two halves apart, at the sizes where the
// pipeline falls short of its rate from 256 MiB: the call (which returns once the last chunk's DMA is
// enqueued, so it holds the host copy and the caller's driver calls) and the synchronize after it (the
// DMAs still queued then), in microseconds per copy, for the default tuning and for variants that shorten
// the unoverlapped first fill and last DMA (smaller chunks) or remove the bursts' drains, and with the
// staging buffers filled by Go's copy instead of fillForDMA.
func BenchmarkGPUPipelineSplit(b *testing.B) {
	e := openGPU(b)
	goCopy := func(dst, src []byte) { copy(dst, src) }
	tunings := []struct {
		name string
		t    StagingTuning
		fill func(dst, src []byte) // how the crew fills a staging buffer; nil: fillForDMA
	}{
		{"default", StagingTuning{}, nil},
		{"no-drain", StagingTuning{Burst: -1}, nil},
		{"chunk-2m", StagingTuning{Chunk: 2 << 20, Buffers: 16}, nil},
		{"chunk-1m-piece-256k", StagingTuning{Chunk: 1 << 20, Buffers: 32, Piece: 256 << 10}, nil},
		{"workers-12", StagingTuning{Workers: 12}, nil},
		{"go-copy", StagingTuning{}, goCopy},
	}
	for _, n := range []int{16 << 20, 64 << 20} {
		p := e.alloc(b, n)
		host := pattern(n, 1)
		for _, tu := range tunings {
			m := New(e.dev, Options{Staging: tu.t})
			s, err := m.Create(true, 0)
			require.NoError(b, err)
			b.Run(fmt.Sprintf("%dMiB/%s", n>>20, tu.name), func(b *testing.B) {
				if tu.fill != nil {
					fillStaging = tu.fill
					defer func() { fillStaging = fillForDMA }()
				}
				b.SetBytes(int64(n))
				var call, sync time.Duration
				for b.Loop() {
					t0 := time.Now()
					if err := m.CopyHtoD(p, host, s); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					if err := s.Synchronize(); err != nil {
						b.Fatal(err)
					}
					call, sync = call+t1.Sub(t0), sync+time.Since(t1)
				}
				b.ReportMetric(float64(call.Microseconds())/float64(b.N), "call-us/op")
				b.ReportMetric(float64(sync.Microseconds())/float64(b.N), "sync-us/op")
			})
			require.NoError(b, s.Destroy())
			require.NoError(b, m.Close())
		}
	}
}

// BenchmarkGPUDMAAfterFill asks whether the copy engine reads pinned memory that the CPU has just written
// (as the staging workers do, a chunk at a time) more slowly than memory written long before: 16 MiB in
// four 4 MiB pinned buffers, each DMA'd to the device on one stream and waited for, timed alone, after
// the buffers were (hot) filled by eight goroutines just before, or (cold) filled and then pushed out of
// the CPU caches by copying 512 MiB elsewhere. Only the DMAs and the synchronize are timed.
func BenchmarkGPUDMAAfterFill(b *testing.B) {
	e := openGPU(b)
	ctx := e.dev.Context()
	const chunk, chunks = 4 << 20, 4
	dst := e.alloc(b, chunk*chunks)
	bufs := make([][]byte, chunks)
	for i := range bufs {
		buf, err := e.drv.MemHostAlloc(ctx, chunk, 0)
		require.NoError(b, err)
		bufs[i] = buf
		b.Cleanup(func() { _ = e.drv.MemFreeHost(ctx, buf) })
	}
	src := pattern(chunk*chunks, 3)
	big, sink := pattern(512<<20, 5), make([]byte, 512<<20)
	s, err := e.m.Create(true, 0)
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Destroy() })
	fill := func() {
		var wg sync.WaitGroup
		for i := range chunks * 2 { // eight goroutines, 2 MiB each
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, off := i/2, (i%2)*(chunk/2)
				copy(bufs[c][off:off+chunk/2], src[c*chunk+off:c*chunk+off+chunk/2])
			}()
		}
		wg.Wait()
	}
	for _, cold := range []bool{false, true} {
		b.Run(map[bool]string{false: "hot", true: "cold"}[cold], func(b *testing.B) {
			b.SetBytes(chunk * chunks)
			var dma time.Duration
			for b.Loop() {
				fill()
				if cold {
					copy(sink, big)
				}
				t0 := time.Now()
				for c := range chunks {
					if err := e.drv.MemcpyHtoDAsync(ctx, dst+cuda.DevicePtr(c*chunk), bufs[c], s.h); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.drv.StreamSynchronize(ctx, s.h); err != nil {
					b.Fatal(err)
				}
				dma += time.Since(t0)
			}
			b.ReportMetric(float64(dma.Microseconds())/float64(b.N), "dma-us/op")
			b.ReportMetric(float64(chunk*chunks)/dma.Seconds()*float64(b.N)/1e9, "dma-GB/s")
		})
	}
}
