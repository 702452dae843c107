package stream

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFillForDMA: every byte lands, whatever dst's alignment and the length (the aligned body, the head
// before dst's first 16-byte boundary and the tail under 64 bytes), and nothing outside dst is written.
func TestFillForDMA(t *testing.T) {
	src := pattern(1<<16+200, 7)
	for _, align := range []int{0, 1, 7, 8, 15, 16, 17, 63} {
		for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4096, 4096 + 63, 1 << 16} {
			t.Run(fmt.Sprintf("align=%d/n=%d", align, n), func(t *testing.T) {
				back := make([]byte, n+align+128)
				for i := range back {
					back[i] = 0xAB
				}
				dst := back[align : align+n]
				fillForDMA(dst, src[3:3+n]) // an unaligned source too
				require.True(t, bytes.Equal(dst, src[3:3+n]))
				for i, b := range back {
					if i < align || i >= align+n {
						require.Equalf(t, byte(0xAB), b, "byte %d outside dst written", i)
					}
				}
			})
		}
	}
}

func TestFillForDMARefusesUnequalLengths(t *testing.T) {
	require.Panics(t, func() { fillForDMA(make([]byte, 4), make([]byte, 5)) })
}

// FuzzFillForDMA: any length and offsets copy exactly as Go's copy does.
func FuzzFillForDMA(f *testing.F) {
	f.Add(uint16(100), uint8(3), uint8(5))
	f.Add(uint16(4096), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, n uint16, dOff, sOff uint8) {
		src := pattern(int(n)+int(sOff), 11)[sOff:]
		want := make([]byte, int(n)+int(dOff)+64)
		got := make([]byte, len(want))
		copy(want[dOff:], src)
		fillForDMA(got[dOff:int(dOff)+int(n)], src)
		require.True(t, bytes.Equal(want, got))
	})
}

// BenchmarkFillForDMA: the fill against Go's copy, 1 MiB pieces (a staging piece) and 4 KiB.
func BenchmarkFillForDMA(b *testing.B) {
	for _, n := range []int{4 << 10, 1 << 20} {
		src, dst := pattern(n, 1), make([]byte, n)
		b.Run(fmt.Sprintf("fill/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				fillForDMA(dst, src)
			}
		})
		b.Run(fmt.Sprintf("copy/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
