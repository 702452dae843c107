//go:build amd64 && !race

package stream

import "unsafe"

// copyNT copies n bytes, a multiple of 64, from src to dst (16-byte aligned) with non-temporal stores,
// then fences them (dmacopy_amd64.s).
//
//go:noescape
func copyNT(dst, src unsafe.Pointer, n uintptr)

// fillNonTemporal is fillForDMA on amd64: Go's copy up to dst's first 16-byte boundary and for the tail
// of less than 64 bytes, non-temporal stores for the rest.
func fillNonTemporal(dst, src []byte) {
	head := int((16 - uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16) % 16)
	if head >= len(dst) {
		copy(dst, src)
		return
	}
	copy(dst[:head], src[:head])
	body := (len(dst) - head) &^ 63
	if body > 0 {
		copyNT(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), uintptr(body))
	}
	copy(dst[head+body:], src[head+body:])
}
