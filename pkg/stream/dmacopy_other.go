//go:build !amd64 || race

package stream

// fillNonTemporal is fillForDMA where no non-temporal copy is written (or the race detector must see the
// accesses): Go's copy.
func fillNonTemporal(dst, src []byte) { copy(dst, src) }
