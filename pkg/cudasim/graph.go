package cudasim

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// graphMem is the memory of a graph's alloc nodes, shared by the graph and its execs and given back when
// the last of them is destroyed. The real driver allocates at launch and frees at the free node; holding
// it for the graph's lifetime is the simple model the simulator takes.
type graphMem struct {
	allocs []*alloc
	refs   int
}

func (m *graphMem) drop(v *device) {
	m.refs--
	if m.refs == 0 {
		for _, a := range m.allocs {
			if a.graphLive {
				a.orphan = true // launched and not freed: the caller's until freed
				continue
			}
			v.release(a)
		}
		m.allocs = nil
	}
}

// freeGraphAlloc frees graph allocation a outside its graph: only a launched one is an allocation.
func (v *device) freeGraphAlloc(op string, a *alloc) error {
	if !a.graphLive {
		return errf(op, cuda.ErrorInvalidValue, "%#x is graph memory that no launch of its graph has allocated (or it was freed): it is not a live allocation on device %d", a.base, v.index)
	}
	a.graphLive = false
	if a.orphan {
		v.release(a)
	}
	return nil
}

type graph struct {
	handle cuda.Graph
	nodes  []node
	mem    *graphMem
}

type graphExec struct {
	nodes []node
	mem   *graphMem
}

func (d *Driver) graph(op string, v *device, gh cuda.Graph) (*graph, error) {
	g := v.graphs[gh]
	if g == nil {
		return nil, errf(op, cuda.ErrorInvalidHandle, "graph %#x is not a live graph of device %d", uint64(gh), v.index)
	}
	return g, nil
}

func (d *Driver) exec(op string, v *device, eh cuda.GraphExec) (*graphExec, error) {
	e := v.execs[eh]
	if e == nil {
		return nil, errf(op, cuda.ErrorInvalidHandle, "graph exec %#x is not a live executable graph of device %d", uint64(eh), v.index)
	}
	return e, nil
}

func (d *Driver) GraphInstantiate(c cuda.Context, gh cuda.Graph) (cuda.GraphExec, error) {
	const op = "cuGraphInstantiateWithFlags"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	// Instantiating is an unsafe call during capture, as destroying an executable graph is (the
	// conformance case CaptureGraphDestroy).
	if err := d.unsafeCall(op, v); err != nil {
		return 0, err
	}
	g, err := d.graph(op, v, gh)
	if err != nil {
		return 0, err
	}
	if err := d.checkNodesLive(op, v, g); err != nil {
		return 0, err
	}
	h := cuda.GraphExec(v.handle(kindExecHandle))
	g.mem.refs++
	v.execs[h] = &graphExec{nodes: slices.Clone(g.nodes), mem: g.mem}
	return h, nil
}

// checkNodesLive does what the real driver does when g names device memory that is no longer allocated
// (freed after the capture): on the H100 cuGraphInstantiate crashes the process for a copy node whose
// memory cuMemFree gave back, and returns CUDA_ERROR_INVALID_VALUE for a memset node. The simulator ends
// the process for the copy (the fatal hook), so that a CI run on it catches any path that frees memory a
// graph still names. Called with the device locked; it returns with it locked.
func (d *Driver) checkNodesLive(op string, v *device, g *graph) error {
	for i := range g.nodes {
		n := &g.nodes[i]
		err := v.check(op, n) // the ranges a launch of the node touches (copy.go)
		if err == nil {
			continue
		}
		if n.kind == nodeMemset {
			return err // CUDA_ERROR_INVALID_VALUE, as the driver answers
		}
		func() {
			v.mu.Unlock() // the fatal hook may panic in tests: leave the device locked for the caller
			defer v.mu.Lock()
			d.fatal(fmt.Sprintf("%s was handed graph %#x, whose copy node %d names device memory that is not allocated (freed after the capture): %v", op, uint64(g.handle), i, err))
		}()
		return errf(op, cuda.ErrorIllegalAddress, "node %d of graph %#x names freed device memory", i, uint64(g.handle))
	}
	return nil
}

func (d *Driver) GraphUpload(c cuda.Context, eh cuda.GraphExec, sh cuda.Stream) error {
	const op = "cuGraphUpload"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if _, err := d.exec(op, v, eh); err != nil {
		return err
	}
	_, err = d.streamOp(op, v, sh)
	return err
}

// GraphLaunch implements cuGraphLaunch: the recorded nodes run in order now, reading and writing host
// memory as it is at this moment. On a capturing stream it fails with 900 and invalidates the capture,
// as the real driver does.
func (d *Driver) GraphLaunch(c cuda.Context, eh cuda.GraphExec, sh cuda.Stream) error {
	const op = "cuGraphLaunch"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	e, err := d.exec(op, v, eh)
	if err != nil {
		return err
	}
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	if s.cap != nil {
		// Measured on the H100 (driver 580), in every capture mode: 900, and the capture is invalidated.
		d.invalidate(s.cap)
		return errf(op, cuda.ErrorStreamCaptureUnsupported, "a graph cannot be launched on a capturing stream; the capture is now invalidated")
	}
	// What the simulator refuses, it refuses before any node runs, so a failed launch has no effect (no
	// graph allocation made live, no bytes moved): the driver refuses a live allocation's relaunch up front.
	for _, n := range e.nodes {
		if a := v.exact(n.dst); n.kind == nodeAlloc && a != nil && a.kind == kindGraph && a.graphLive {
			return errf(op, cuda.ErrorInvalidValue, "the graph's allocation at %#x from an earlier launch was not freed: free it before launching the graph again", uint64(n.dst))
		}
		if (n.kind == nodeHtoD || n.kind == nodeDtoH) && n.pinned && !d.stillPinned(n.pinBase) {
			// The real driver launches it and the copy faults the device (CUDA_ERROR_LAUNCH_FAILED at the
			// next synchronize, the context lost), or cuGraphLaunch itself crashes: fail as loudly.
			func() {
				v.mu.Unlock() // the fatal hook may panic in tests: leave the device locked for the caller
				defer v.mu.Lock()
				d.fatal(fmt.Sprintf("%s was handed an executable graph whose copy names pinned host memory that was freed after the capture", op))
			}()
			return errf(op, cuda.ErrorLaunchFailed, "the pinned host memory of a copy was freed")
		}
		if err := v.check(op, &n); err != nil {
			return err
		}
	}
	for i := range e.nodes {
		if err := d.run(op, v, &e.nodes[i]); err != nil {
			// A node that fails after the checks (memory a node of this launch freed) ends the launch; the
			// allocations this launch made are taken back, so that nothing stays allocated for no owner.
			for j := range i {
				if n := e.nodes[j]; n.kind == nodeAlloc {
					if a := v.exact(n.dst); a != nil && a.kind == kindGraph && a.graphLive {
						a.graphLive = false
					}
				}
			}
			return err
		}
	}
	return nil
}

// GraphExecUpdate implements cuGraphExecUpdate_v2: the update succeeds when the new graph has the same
// nodes, kind for kind in order (the simulator's graphs are chains), and takes their parameters. As on
// the driver, alloc nodes of the same size at other addresses do not stop it: the executable graph's
// launches allocate at the new graph's addresses from then on (conformance case GraphMemoryUpdate), so
// it holds the new graph's memory instead of its own. Free nodes are taken with their allocations (not
// measured: cudacore updates no graph that allocates).
func (d *Driver) GraphExecUpdate(c cuda.Context, eh cuda.GraphExec, gh cuda.Graph) error {
	const op = "cuGraphExecUpdate_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	e, err := d.exec(op, v, eh)
	if err != nil {
		return err
	}
	g, err := d.graph(op, v, gh)
	if err != nil {
		return err
	}
	same := len(e.nodes) == len(g.nodes)
	for i := 0; same && i < len(g.nodes); i++ {
		same = e.nodes[i].kind == g.nodes[i].kind
		if same && g.nodes[i].kind == nodeAlloc {
			same = e.nodes[i].n == g.nodes[i].n
		}
	}
	if !same {
		return errf(op, cuda.ErrorGraphExecUpdateFailure, "the graph's topology differs from the executable graph's")
	}
	e.nodes = slices.Clone(g.nodes)
	if e.mem != g.mem {
		e.mem.drop(v)
		g.mem.refs++
		e.mem = g.mem
	}
	return nil
}

func (d *Driver) GraphExecDestroy(c cuda.Context, eh cuda.GraphExec) error {
	const op = "cuGraphExecDestroy"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	// Destroying an executable graph is an unsafe call during capture, as a synchronous allocation is;
	// destroying a graph is not (docs/contributing/driver-facts.md, "Stream capture").
	if err := d.unsafeCall(op, v); err != nil {
		return err
	}
	e, err := d.exec(op, v, eh)
	if err != nil {
		return err
	}
	delete(v.execs, eh)
	e.mem.drop(v)
	return nil
}

func (d *Driver) GraphDestroy(c cuda.Context, gh cuda.Graph) error {
	const op = "cuGraphDestroy"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	g, err := d.graph(op, v, gh)
	if err != nil {
		return err
	}
	delete(v.graphs, gh)
	g.mem.drop(v)
	return nil
}

// DeviceGraphMemTrim implements cuDeviceGraphMemTrim. The simulator gives graph memory back as soon as
// nothing holds it, so there is nothing to trim; the context and device are still checked.
func (d *Driver) DeviceGraphMemTrim(c cuda.Context, dev cuda.Device) error {
	const op = "cuDeviceGraphMemTrim"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if int(dev) != v.index {
		return errf(op, cuda.ErrorInvalidDevice, "device %d is not the context's device %d", int(dev), v.index)
	}
	return nil
}

func (d *Driver) GraphNodeCount(c cuda.Context, gh cuda.Graph) (int, error) {
	const op = "cuGraphGetNodes"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	g, err := d.graph(op, v, gh)
	if err != nil {
		return 0, err
	}
	return len(g.nodes), nil
}

var nodeNames = map[nodeKind]string{nodeHtoD: "MEMCPY HtoD", nodeDtoH: "MEMCPY DtoH", nodeDtoD: "MEMCPY DtoD",
	nodeMemset: "MEMSET", nodeAlloc: "MEM_ALLOC", nodeFree: "MEM_FREE"}

// GraphDebugDot writes the graph's chain of nodes as DOT, with each node's addresses and size when
// verbose. As with the driver, a file that cannot be written is CUDA_ERROR_OPERATING_SYSTEM.
func (d *Driver) GraphDebugDot(c cuda.Context, gh cuda.Graph, path string, verbose bool) error {
	const op = "cuGraphDebugDotPrint"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	g, err := d.graph(op, v, gh)
	if err != nil {
		v.mu.Unlock()
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "digraph cudasim_graph_%#x {\n", uint64(gh))
	for i, n := range g.nodes {
		label := nodeNames[n.kind]
		if verbose {
			size := n.n
			if n.kind == nodeHtoD || n.kind == nodeDtoH {
				size = uint64(len(n.host)) // a host copy's size is its host slice's
			}
			label += fmt.Sprintf("\\ndst %#x src %#x\\n%d bytes", uint64(n.dst), uint64(n.src), size)
		}
		fmt.Fprintf(&b, "\tn%d [label=\"%d: %s\"];\n", i, i, label)
		if i > 0 {
			fmt.Fprintf(&b, "\tn%d -> n%d;\n", i-1, i)
		}
	}
	b.WriteString("}\n")
	v.mu.Unlock() // the file is written without the device's lock
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return errf(op, cuda.ErrorOperatingSystem, "%v", err)
	}
	return nil
}
