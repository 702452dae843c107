package cudasim

import (
	"github.com/cudacore/cudacore/pkg/cuda"
)

func (v *device) outOfBounds(op string, p cuda.DevicePtr, n uint64) error {
	return errf(op, cuda.ErrorInvalidValue, "[%#x, +%d) is not inside one live allocation of device %d", uint64(p), n, v.index)
}

// run executes one node now. Bounds are checked again because the memory may have been freed since the
// node was recorded.
func (d *Driver) run(op string, v *device, n *node) error {
	switch n.kind {
	case nodeHtoD:
		if n.pinned && !d.stillPinned(n.pinBase) {
			return errf(op, cuda.ErrorInvalidValue, "the pinned host memory of a copy was freed")
		}
		if len(n.host) == 0 {
			return nil
		}
		a, off, ok := v.find(n.dst, uint64(len(n.host)))
		if !ok {
			return v.outOfBounds(op, n.dst, uint64(len(n.host)))
		}
		copy(a.bytes()[off:], n.host)
	case nodeDtoH:
		if n.pinned && !d.stillPinned(n.pinBase) {
			return errf(op, cuda.ErrorInvalidValue, "the pinned host memory of a copy was freed")
		}
		if len(n.host) == 0 {
			return nil
		}
		a, off, ok := v.find(n.src, uint64(len(n.host)))
		if !ok {
			return v.outOfBounds(op, n.src, uint64(len(n.host)))
		}
		copy(n.host, a.bytes()[off:])
	case nodeDtoD:
		if n.n == 0 {
			return nil
		}
		s, soff, ok := v.find(n.src, n.n)
		if !ok {
			return v.outOfBounds(op, n.src, n.n)
		}
		t, toff, ok := v.find(n.dst, n.n)
		if !ok {
			return v.outOfBounds(op, n.dst, n.n)
		}
		copy(t.bytes()[toff:toff+n.n], s.bytes()[soff:soff+n.n])
	case nodeAlloc:
		a := v.exact(n.dst)
		if a == nil || a.kind != kindGraph {
			return errf(op, cuda.ErrorInvalidValue, "the graph's allocation at %#x is gone", uint64(n.dst))
		}
		if a.graphLive {
			return errf(op, cuda.ErrorInvalidValue, "the graph's allocation at %#x from an earlier launch was not freed: free it before launching the graph again", uint64(n.dst))
		}
		a.graphLive = true
	case nodeFree:
		a := v.exact(n.dst)
		if a == nil || a.kind != kindGraph {
			return errf(op, cuda.ErrorInvalidValue, "%#x is not graph memory", uint64(n.dst))
		}
		return v.freeGraphAlloc(op, a)
	case nodeMemset:
		if n.n == 0 {
			return nil
		}
		t, off, ok := v.find(n.dst, n.n)
		if !ok {
			return v.outOfBounds(op, n.dst, n.n)
		}
		b := t.bytes()[off : off+n.n]
		for i := range b {
			b[i] = n.value
		}
	}
	return nil
}

// check validates a node's device ranges at enqueue time, as the driver validates arguments at the call.
func (v *device) check(op string, n *node) error {
	switch n.kind {
	case nodeHtoD:
		if _, _, ok := v.find(n.dst, uint64(len(n.host))); !ok && len(n.host) > 0 {
			return v.outOfBounds(op, n.dst, uint64(len(n.host)))
		}
	case nodeDtoH:
		if _, _, ok := v.find(n.src, uint64(len(n.host))); !ok && len(n.host) > 0 {
			return v.outOfBounds(op, n.src, uint64(len(n.host)))
		}
	case nodeDtoD:
		if n.n == 0 {
			return nil
		}
		if _, _, ok := v.find(n.src, n.n); !ok {
			return v.outOfBounds(op, n.src, n.n)
		}
		fallthrough
	case nodeMemset:
		if _, _, ok := v.find(n.dst, n.n); !ok && n.n > 0 {
			return v.outOfBounds(op, n.dst, n.n)
		}
	}
	return nil
}

func (d *Driver) hostNode(kind nodeKind, p cuda.DevicePtr, b []byte) node {
	n := node{kind: kind, host: b}
	if kind == nodeHtoD {
		n.dst = p
	} else {
		n.src = p
	}
	n.pinBase, n.pinned = d.pinnedBase(b)
	return n
}

// syncCopy runs a synchronous copy, which goes through the legacy stream.
func (d *Driver) syncCopy(op string, c cuda.Context, n node) error {
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := d.implicitSync(op, v); err != nil {
		return err
	}
	if err := v.check(op, &n); err != nil {
		return err
	}
	return d.run(op, v, &n)
}

// asyncOp enqueues n on a stream: recorded while it captures, run at once otherwise.
func (d *Driver) asyncOp(op string, c cuda.Context, sh cuda.Stream, n node) error {
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	if err := v.check(op, &n); err != nil {
		return err
	}
	if s.cap != nil {
		s.cap.add(s, n)
		return nil
	}
	return d.run(op, v, &n)
}

func (d *Driver) MemcpyHtoD(c cuda.Context, dst cuda.DevicePtr, src []byte) error {
	return d.syncCopy("cuMemcpyHtoD_v2", c, d.hostNode(nodeHtoD, dst, src))
}

func (d *Driver) MemcpyDtoH(c cuda.Context, dst []byte, src cuda.DevicePtr) error {
	return d.syncCopy("cuMemcpyDtoH_v2", c, d.hostNode(nodeDtoH, src, dst))
}

func (d *Driver) MemcpyDtoD(c cuda.Context, dst, src cuda.DevicePtr, n uint64) error {
	return d.syncCopy("cuMemcpyDtoD_v2", c, node{kind: nodeDtoD, dst: dst, src: src, n: n})
}

func (d *Driver) MemcpyHtoDAsync(c cuda.Context, dst cuda.DevicePtr, src []byte, s cuda.Stream) error {
	return d.asyncOp("cuMemcpyHtoDAsync_v2", c, s, d.hostNode(nodeHtoD, dst, src))
}

func (d *Driver) MemcpyDtoHAsync(c cuda.Context, dst []byte, src cuda.DevicePtr, s cuda.Stream) error {
	return d.asyncOp("cuMemcpyDtoHAsync_v2", c, s, d.hostNode(nodeDtoH, src, dst))
}

func (d *Driver) MemcpyDtoDAsync(c cuda.Context, dst, src cuda.DevicePtr, n uint64, s cuda.Stream) error {
	return d.asyncOp("cuMemcpyDtoDAsync_v2", c, s, node{kind: nodeDtoD, dst: dst, src: src, n: n})
}

func (d *Driver) MemsetD8Async(c cuda.Context, dst cuda.DevicePtr, value uint8, n uint64, s cuda.Stream) error {
	return d.asyncOp("cuMemsetD8Async", c, s, node{kind: nodeMemset, dst: dst, value: value, n: n})
}
