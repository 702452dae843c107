package memory

import (
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// benchPair measures a 1 MiB allocate+free pair through r on one stream; after the first pair every
// allocation is a cache hit where r caches.
func benchPair(b *testing.B, r Resource) {
	const size = 1 << 20
	p, err := r.Allocate(size, cuda.StreamLegacy)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Deallocate(p, size, cuda.StreamLegacy); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p, err := r.Allocate(size, cuda.StreamLegacy)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Deallocate(p, size, cuda.StreamLegacy); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCacheHit1MiB(b *testing.B) {
	_, d := openSim(b)
	pool, err := NewPool(d)
	if err != nil {
		b.Fatal(err)
	}
	benchPair(b, NewCache(pool, CacheOptions{}))
}

func BenchmarkStackHit1MiB(b *testing.B) {
	_, d := openSim(b)
	benchPair(b, newStack(b, d, StackOptions{}))
}

func BenchmarkStackTrackedHit1MiB(b *testing.B) {
	_, d := openSim(b)
	benchPair(b, newStack(b, d, StackOptions{Track: true}))
}

// The simulator's pool without the cache: what a driver call costs here (the real driver: 0.78 µs).
func BenchmarkPoolNoCache1MiB(b *testing.B) {
	_, d := openSim(b)
	benchPair(b, newStack(b, d, StackOptions{NoCache: true}))
}

// Many goroutines on one stream (the usual Python case: everyone on the default stream).
func BenchmarkStackHit1MiBParallel(b *testing.B) {
	_, d := openSim(b)
	s := newStack(b, d, StackOptions{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := s.Allocate(1<<20, cuda.StreamLegacy)
			if err != nil {
				b.Error(err)
				return
			}
			if err := s.Deallocate(p, 1<<20, cuda.StreamLegacy); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkStackRecorder is the flight recorder's cost on the pair it records twice (alloc and free): the
// 1 MiB cache hit through the whole Stack, recorder off and on. bench/recorder.py measures the same from
// Python, where the pair costs more and the share is smaller.
func BenchmarkStackRecorder(b *testing.B) {
	recorderOffOn(b, func(b *testing.B, s *Stack) { benchPair(b, s) })
}

// recorderOffOn runs bench as the sub-benchmarks "off" and "on", on a Stack of the simulator whose
// recorder is disabled, then enabled.
func recorderOffOn(b *testing.B, bench func(b *testing.B, s *Stack)) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			_, d := openSim(b)
			rec := NewRecorder(0)
			rec.SetEnabled(on)
			bench(b, newStack(b, d, StackOptions{Recorder: rec}))
		})
	}
}
