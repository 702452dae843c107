package cudacore

import "testing"

// BenchmarkFacadePair is an alloc+free pair through the facade's Allocate and Free on the simulator: the
// Go half of Device.allocate(...).close() when it enters Go (the guard, the device lookup, the allocator's
// cache hit and the recorder), without the crossing from Python. bench/alloc.py measures the whole pair.
func BenchmarkFacadePair(b *testing.B) {
	b.Setenv("CUDACORE_BACKEND", "sim")
	p, err := Allocate(0, 256, 0, make([]byte, 8))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := Free(0, p, 256, 0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		p, err := Allocate(0, 256, 0, make([]byte, 8))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Free(0, p, 256, 0); err != nil {
			b.Fatal(err)
		}
	}
}
