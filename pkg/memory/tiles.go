package memory

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// OpTiles is the Op of AllocateTiles' own errors (bad input, cancellation).
const OpTiles = "cudacore.allocate_tiles"

// checkTiles validates a tiled request and returns its total size.
// manyTiles is the count above which a request larger than the device is refused without trying.
const manyTiles = 1 << 16

func checkTiles(count int, tileSize uint64) (uint64, error) {
	if count <= 0 {
		return 0, invalid(OpTiles, fmt.Sprintf("count must be positive, got %d", count),
			cuda.Field{Key: "count", Value: fmt.Sprint(count)})
	}
	if tileSize == 0 {
		return 0, invalid(OpTiles, "tile size must be positive: cannot allocate tiles of 0 bytes", field("tile_size", 0))
	}
	hi, total := bits.Mul64(uint64(count), tileSize)
	if hi != 0 {
		return 0, invalid(OpTiles, fmt.Sprintf("%d tiles of %d bytes overflow a 64-bit byte count", count, tileSize),
			cuda.Field{Key: "count", Value: fmt.Sprint(count)}, field("tile_size", tileSize))
	}
	return total, nil
}

// AllocateTiles allocates count tiles of tileSize bytes from r on s, all or nothing: the caller owns the
// returned pointers (free each with r.Deallocate(p, tileSize, s)).
//
// If tile k fails, tiles k-1 down to 0 are deallocated (in reverse, so a stack-like pool gets them back in
// order), the cached memory of r's composition is released so that the device's free memory returns to
// where it was (exactly, when nothing was cached before the call), and the error is returned: for out of
// memory, an OOM *cuda.Error carrying the cause's fields and Op plus tiles_requested, tiles_allocated,
// tile_size and tiles_fit (how many tiles of that size fit in the memory free now, when r's device is
// known), whose message says so.
//
// progress, if not nil, is called after each tile with (done, count); returning false cancels: every tile
// is released and the error is an IllegalState *cuda.Error (Op OpTiles) saying it was cancelled. Not
// InvalidValue (the request was fine) nor OutOfMemory (memory did not run out): a cancelled operation is
// a state the caller chose, and IllegalState is the category that says "not completed, nothing changed".
//
// Bad input (count <= 0, tileSize 0, count*tileSize overflowing) is InvalidValue and calls nothing.
func AllocateTiles(r Resource, count int, tileSize uint64, s cuda.Stream, progress func(done, total int) bool) ([]cuda.DevicePtr, error) {
	total, err := checkTiles(count, tileSize)
	if err != nil {
		return nil, err
	}
	// More than the device holds can never fit. A moderate count is still tried, so that the error says
	// how many tiles did fit; a count past manyTiles is refused at once, since allocating it tile by tile
	// until memory runs out would take minutes to hours.
	if d := DeviceOf(r); d != nil && count > manyTiles {
		if max := d.Properties().TotalMemory; max != 0 && total > max {
			return nil, tileError(r, 0, count, tileSize, OutOfMemory(d, total, cuda.NewError(OpTiles, cuda.ErrorOutOfMemory, ""), PoolState{}))
		}
	}
	// The slice grows with the tiles: its size must not follow a count the caller chose before any
	// memory was found (a huge count ended the process in the Go runtime's own out-of-memory).
	tiles := make([]cuda.DevicePtr, 0, min(count, 4096))
	rollback := func() {
		for i := len(tiles) - 1; i >= 0; i-- {
			// A failed free here leaves a tile allocated; nothing better can be done than to go on
			// freeing the rest, and the original error is what the caller needs.
			_ = r.Deallocate(tiles[i], tileSize, s)
		}
		_ = Release(r)
	}
	for k := 0; k < count; k++ {
		p, err := r.Allocate(tileSize, s)
		if err != nil {
			rollback()
			return nil, tileError(r, k, count, tileSize, err)
		}
		tiles = append(tiles, p)
		if progress != nil && !progress(k+1, count) {
			done := len(tiles)
			rollback()
			return nil, cuda.NewError(OpTiles, cuda.ErrorIllegalState,
				fmt.Sprintf("cancelled by the progress callback after %d of %d tiles of %s; all of them were released",
					done, count, FormatBytes(tileSize)),
				cuda.Field{Key: "tiles_requested", Value: fmt.Sprint(count)},
				cuda.Field{Key: "tiles_allocated", Value: fmt.Sprint(done)}, field("tile_size", tileSize))
		}
	}
	return tiles, nil
}

func tileError(r Resource, k, count int, tileSize uint64, cause error) error {
	if !errors.Is(cause, cuda.ErrOutOfMemory) {
		return fmt.Errorf("tile %d of %d (%s each; the %d before it were released): %w", k+1, count, FormatBytes(tileSize), k, cause)
	}
	// The cause's own message describes the one tile that failed, with the memory of that moment (all
	// the earlier tiles still held): stale once they are released, so only its fields carry over.
	op := OpTiles
	var fields []cuda.Field
	var ce *cuda.Error
	if errors.As(cause, &ce) {
		op = ce.Op
		for _, f := range ce.Fields {
			switch f.Key {
			case "free", "cached": // stale: the tiles were released since; re-read below
			default:
				fields = append(fields, f)
			}
		}
	}
	fields = append(fields,
		cuda.Field{Key: "tiles_requested", Value: fmt.Sprint(count)},
		cuda.Field{Key: "tiles_allocated", Value: fmt.Sprint(k)}, field("tile_size", tileSize))
	text := fmt.Sprintf("allocated %d of %d tiles of %s before running out of memory (all released again)", k, count, FormatBytes(tileSize))
	if ce != nil {
		if c, ok := ce.Field("cause"); ok && causeLead[c] != "" {
			text = causeLead[c] + ": " + text // every out-of-memory message leads with its verdict
		}
	}
	if d := DeviceOf(r); d != nil {
		if free, _, err := d.MemoryInfo(); err == nil {
			cached := Cached(r)
			fit := (free + cached) / blockSizeOf(r, tileSize)
			text += fmt.Sprintf("; %d tiles of that size fit in the %s free now", fit, FormatBytes(free+cached))
			fields = append(fields, field("free", free), field("cached", cached), field("tiles_fit", fit))
		}
	}
	return cuda.NewError(op, cuda.ErrorOutOfMemory, text, fields...)
}

// Admit answers "would count tiles of tileSize fit now?" for r on d: fits is true when the device's free
// memory plus what r's composition holds cached (the Cache's free lists and the pool's reserve, which an
// allocation can reuse or Retry can release) covers count tiles, each rounded up to the block r would
// really take. It is an estimate at one instant: other streams and processes allocate too, and the
// driver's own granularity is not modelled. Bad input is InvalidValue as for AllocateTiles.
func Admit(d *device.Device, r Resource, count int, tileSize uint64) (fits bool, free uint64, cached uint64, err error) {
	if _, err := checkTiles(count, tileSize); err != nil {
		return false, 0, 0, err
	}
	if free, _, err = d.MemoryInfo(); err != nil {
		return false, 0, 0, err
	}
	cached = Cached(r)
	hi, need := bits.Mul64(uint64(count), blockSizeOf(r, tileSize))
	avail := free + cached
	if avail < free { // cannot happen with real numbers; saturate rather than wrap
		avail = ^uint64(0)
	}
	return hi == 0 && need <= avail, free, cached, nil
}
