package cudacore

import "testing"

func BenchmarkFacadePair(b *testing.B) {
	b.Setenv("CUDACORE_BACKEND", "sim")
	p, err := Allocate(0, 256, 0)
	if err != nil {
		b.Fatal(err)
	}
	Free(0, p, 256, 0)
	for b.Loop() {
		p, _ := Allocate(0, 256, 0)
		Free(0, p, 256, 0)
	}
}
