package memory

import (
	"fmt"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// forgetter is implemented by the adaptors that keep books on what they hand out: forget drops p (size
// bytes, as allocated) from this layer's books only; Forget walks the composition.
type forgetter interface {
	forget(p cuda.DevicePtr, size uint64) error
}

// Forget takes p (allocated from r with size) off the books of r's composition without freeing it:
// for memory the driver took back by itself, such as a graph allocation whose graph was destroyed before
// any launch made it real. With a Tracker, an unknown p is an InvalidValue error and nothing changes.
// Layers that keep no books (the base resources) are not called.
func Forget(r Resource, p cuda.DevicePtr, size uint64) error {
	for i := 0; r != nil && i < maxDepth; i++ {
		if f, ok := r.(forgetter); ok {
			if err := f.forget(p, size); err != nil {
				return err
			}
		}
		r = unwrap(r)
	}
	return nil
}

// Forget is the package's Forget on this stack.
func (s *Stack) Forget(p cuda.DevicePtr, size uint64) error { return Forget(s.top, p, size) }

func (t *Tracker) forget(p cuda.DevicePtr, size uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.live[p]
	if !ok || rec.size != size {
		return invalid("cudacore.forget", fmt.Sprintf("pointer %#x of %d bytes is not a live allocation of this resource", uint64(p), size),
			cuda.Field{Key: "ptr", Value: fmt.Sprintf("%#x", uint64(p))})
	}
	delete(t.live, p)
	return nil
}

func (r *Stats) forget(_ cuda.DevicePtr, size uint64) error {
	r.inUse.Add(-size)
	return nil
}

func (l *Limit) forget(_ cuda.DevicePtr, size uint64) error {
	l.inUse.Add(-size)
	return nil
}

func (c *Cache) forget(p cuda.DevicePtr, _ uint64) error {
	c.forgetCaptured(p)
	return nil
}
