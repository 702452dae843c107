package stream

// fillForDMA copies src into dst, a staging buffer that the copy engine reads next (host to device), and
// returns once the bytes are in memory rather than in the CPU's caches.
//
// Why: the copy engine reads host memory through the CPU's coherence, and lines the CPU has just written
// and still holds dirty in its caches are read more slowly than memory (measured in driver-facts.md,
// "Pageable copies"). Go's copy keeps what it writes in the caches on CPUs where it uses
// REP MOVSB, so on amd64 the bulk of the copy uses non-temporal stores, which go around the caches, and a
// store fence orders them before the caller's next write (the worker's atomic that publishes the piece).
// Elsewhere, and under the race detector (which does not see assembly's accesses), it is Go's copy.
//
// dst and src must not overlap and must be of equal length.
func fillForDMA(dst, src []byte) {
	if len(dst) != len(src) {
		panic("stream: fillForDMA of slices of different lengths")
	}
	if len(dst) == 0 {
		return
	}
	fillNonTemporal(dst, src)
}
