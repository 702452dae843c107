package cudacore

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Copies take host memory as a []byte that the door fills from Python's buffer protocol (bytes,
// bytearray, memoryview, numpy arrays, PinnedBuffer): a pointer that an exporter vouches for, never a raw
// address, and never an array of Python objects. The generated wrapper holds the buffer view for the
// whole call. Each copy comes twice, with the same body: a GIL-releasing entry for synchronous and large
// copies, and a "Held" one that keeps the GIL, for small asynchronous copies where releasing it would cost
// more than the copy (python/cudacore/_copy.py picks).
//
// Lifetimes: synchronous copies are done when they return. An asynchronous copy of pinned memory reads or
// writes it when the stream gets there: the caller keeps it alive and unchanged until then. Pageable
// memory is staged through pinned buffers (see pkg/stream), so the caller's memory is free to go when an
// asynchronous copy from it returns.

func hostBytes(op string, b []byte, n int) ([]byte, error) {
	if n < 0 {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the copy size must be >= 0 bytes, got %d", n))
	}
	if len(b) < n {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"the host buffer holds %d bytes but the copy needs %d; pass a host buffer of at least %d bytes, or copy fewer", len(b), n, n))
	}
	return b[:n], nil
}

// copyStream resolves the stream argument of a copy: -1 is synchronous (nil).
func copyStream(op string, ordinal, handle int) (*stream.Manager, *stream.Stream, error) {
	if handle == -1 {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return nil, nil, err
		}
		return d.Streams(), nil, nil
	}
	d, s, err := streamOf(op, ordinal, handle)
	if err != nil {
		return nil, nil, err
	}
	return d.Streams(), s, nil
}

func devPtr(op string, p int) (cuda.DevicePtr, error) {
	if p == 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, "the device address is NULL")
	}
	return cuda.DevicePtr(uint64(p)), nil
}

func copyHtoD(ordinal, dst int, host []byte, n, streamHandle int) (int, error) {
	const op = "cudacore.copy_from"
	b, err := hostBytes(op, host, n)
	if err != nil {
		return 0, err
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	p, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	return n, m.CopyHtoD(p, b, s)
}

func copyDtoH(ordinal int, host []byte, src, n, streamHandle int) (int, error) {
	const op = "cudacore.copy_to"
	b, err := hostBytes(op, host, n)
	if err != nil {
		return 0, err
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	p, err := devPtr(op, src)
	if err != nil {
		return 0, err
	}
	return n, m.CopyDtoH(b, p, s)
}

func copyDtoD(ordinal, dst, src, n, streamHandle int) (int, error) {
	const op = "cudacore.copy"
	if n < 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the copy size must be >= 0 bytes, got %d", n))
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	d, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	sp, err := devPtr(op, src)
	if err != nil {
		return 0, err
	}
	return n, m.CopyDtoD(d, sp, uint64(n), s)
}

// CopyToDevice copies the first n bytes of host memory to device address dst of the device at ordinal,
// on a stream (-1: synchronously). It returns n.
//
//cudacore:gil release
//cudacore:door hot
func CopyToDevice(ordinal, dst int, host []byte, n, stream int) (int, error) {
	return guard("cudacore.copy_from", func() (int, error) { return copyHtoD(ordinal, dst, host, n, stream) })
}

// CopyToDeviceHeld is CopyToDevice keeping the GIL, for small asynchronous copies.
//
//cudacore:gil hold
//cudacore:door hot
func CopyToDeviceHeld(ordinal, dst int, host []byte, n, stream int) (int, error) {
	return guard("cudacore.copy_from", func() (int, error) { return copyHtoD(ordinal, dst, host, n, stream) })
}

// CopyToHost copies n bytes from device address src into writable host memory, on a stream (-1:
// synchronously). It returns n.
//
//cudacore:gil release
//cudacore:door hot
//cudacore:writable host
func CopyToHost(ordinal int, host []byte, src, n, stream int) (int, error) {
	return guard("cudacore.copy_to", func() (int, error) { return copyDtoH(ordinal, host, src, n, stream) })
}

// CopyToHostHeld is CopyToHost keeping the GIL, for small asynchronous copies into pinned memory.
//
//cudacore:gil hold
//cudacore:door hot
//cudacore:writable host
func CopyToHostHeld(ordinal int, host []byte, src, n, stream int) (int, error) {
	return guard("cudacore.copy_to", func() (int, error) { return copyDtoH(ordinal, host, src, n, stream) })
}

// CopyDevice copies n bytes between device addresses of one device, on a stream (-1: synchronously). It
// returns n.
//
//cudacore:gil release
//cudacore:door hot
func CopyDevice(ordinal, dst, src, n, stream int) (int, error) {
	return guard("cudacore.copy", func() (int, error) { return copyDtoD(ordinal, dst, src, n, stream) })
}

// CopyDeviceHeld is CopyDevice keeping the GIL, for asynchronous copies (they only enqueue).
//
//cudacore:gil hold
//cudacore:door hot
func CopyDeviceHeld(ordinal, dst, src, n, stream int) (int, error) {
	return guard("cudacore.copy", func() (int, error) { return copyDtoD(ordinal, dst, src, n, stream) })
}

// Fill sets n bytes at device address dst of the device at ordinal to value (0..255), on a stream (-1:
// synchronously, waited for). It returns n.
//
//cudacore:gil release
func Fill(ordinal, dst, value, n, stream int) (int, error) {
	return guard("cudacore.fill", func() (int, error) { return fill(ordinal, dst, value, n, stream) })
}

func fill(ordinal, dst, value, n, streamHandle int) (int, error) {
	const op = "cudacore.fill"
	if value < 0 || value > 255 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the fill value must be a byte, 0..255, got %d", value))
	}
	if n < 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the fill size must be >= 0 bytes, got %d", n))
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	p, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	return n, m.Fill(p, uint8(value), uint64(n), s)
}

// stagingJSON is a stream.StagingTuning as Python reads and writes it.
type stagingJSON struct {
	Chunk   int `json:"chunk"`
	Buffers int `json:"buffers"`
	Workers int `json:"workers"`
	Piece   int `json:"piece"`
	Burst   int `json:"burst"`
}

// StagingTuning sets how device ordinal stages pageable copies (stream.Manager.SetStagingTuning) when
// spec is a JSON object of chunk, buffers, workers and piece (a field left out or 0: its default), and
// returns the tuning in force as the same JSON object; "" changes nothing. It is an internal hook for
// benchmarks that compare settings in one process (scripts/gpu/pageable_probe.py), not an API: the
// defaults are what users get. Changing the tuning frees the staging buffers, which can wait for their
// copies, so the GIL is released.
//
//cudacore:gil release
func StagingTuning(ordinal int, spec string) (string, error) {
	return guard("cudacore.staging_tuning", func() (string, error) {
		const op = "cudacore.staging_tuning"
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		m := d.Streams()
		if spec != "" {
			var j stagingJSON
			dec := json.NewDecoder(strings.NewReader(spec))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&j); err != nil {
				return "", cuda.NewError(op, cuda.ErrorInvalidValue,
					fmt.Sprintf("the staging tuning must be a JSON object of chunk, buffers, workers, piece and burst (integers): %v", err))
			}
			if err := m.SetStagingTuning(stream.StagingTuning{Chunk: j.Chunk, Buffers: j.Buffers, Workers: j.Workers, Piece: j.Piece, Burst: j.Burst}); err != nil {
				return "", err
			}
		}
		t := m.StagingTuning()
		b, err := json.Marshal(stagingJSON{Chunk: t.Chunk, Buffers: t.Buffers, Workers: t.Workers, Piece: t.Piece, Burst: t.Burst})
		return string(b), err
	})
}
