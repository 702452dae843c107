package memory

import (
	"testing"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// BenchmarkStackRecycled is the replay of a full recycle log (32 recycled pairs: what C served for 32
// alloc+free pairs) through Stack.Recycled, recorder off and on; divide by 32 for the cost per pair.
func BenchmarkStackRecycled(b *testing.B) {
	recorderOffOn(b, func(b *testing.B, s *Stack) {
		at := time.Now()
		ops := make([]Recycle, 64)
		for i := range ops {
			ops[i] = Recycle{At: at, Free: i%2 == 0, Ptr: 0x1000, Size: 256, Stream: cuda.StreamLegacy}
		}
		for b.Loop() {
			s.Recycled(ops)
		}
	})
}
