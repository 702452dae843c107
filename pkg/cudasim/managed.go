package cudasim

import (
	"github.com/cudacore/cudacore/pkg/cuda"
)

// managedRange returns an error unless [p, p+n) lies inside one managed allocation of v.
func (v *device) managedRange(op string, p cuda.DevicePtr, n uint64) error {
	if n == 0 {
		return errf(op, cuda.ErrorInvalidValue, "the range is empty")
	}
	a, _, ok := v.find(p, n)
	if !ok {
		return v.outOfBounds(op, p, n)
	}
	if a.kind != kindManaged {
		return errf(op, cuda.ErrorInvalidValue, "[%#x, +%d) is not managed memory", uint64(p), n)
	}
	return nil
}

// location checks a device number of the managed-memory calls: an ordinal of this driver, or cuda.CPU.
func (d *Driver) location(op string, dev int) error {
	if dev == cuda.CPU || dev >= 0 && dev < len(d.devs) {
		return nil
	}
	return errf(op, cuda.ErrorInvalidDevice, "device %d is neither a device nor CU_DEVICE_CPU", dev)
}

// MemPrefetchAsync implements cuMemPrefetchAsync. The simulator's managed memory is host memory wherever
// it is used, so a prefetch moves nothing; the arguments are checked as the driver checks them.
func (d *Driver) MemPrefetchAsync(c cuda.Context, p cuda.DevicePtr, n uint64, dst int, sh cuda.Stream) error {
	const op = "cuMemPrefetchAsync"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := v.managedRange(op, p, n); err != nil {
		return err
	}
	if err := d.location(op, dst); err != nil {
		return err
	}
	_, err = d.streamOp(op, v, sh)
	return err
}

// MemAdvise implements cuMemAdvise: the hint is checked and has no effect in the simulator.
func (d *Driver) MemAdvise(c cuda.Context, p cuda.DevicePtr, n uint64, advice cuda.MemAdvice, dev int) error {
	const op = "cuMemAdvise"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := v.managedRange(op, p, n); err != nil {
		return err
	}
	if advice < cuda.AdviseSetReadMostly || advice > cuda.AdviseUnsetAccessedBy {
		return errf(op, cuda.ErrorInvalidValue, "unknown advice %d", int(advice))
	}
	return d.location(op, dev)
}
