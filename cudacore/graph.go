package cudacore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Graphs are named by numbers of ours (StreamEndCapture returns one). GraphDestroy removes the number,
// so a later use of it is an InvalidHandle error made here: the driver never sees a destroyed graph's
// handle (the real driver may crash on one).

func graphOf(op string, id int) (*stream.Graph, error) {
	g, ok := process.Graphs.Get(id)
	if !ok {
		if process.Graphs.Issued(id) {
			return nil, cuda.NewError(op, cuda.ErrorClosed, fmt.Sprintf("graph %d was destroyed; capture it again", id))
		}
		return nil, cuda.NewError(op, cuda.ErrorInvalidHandle, fmt.Sprintf("%d is not a graph of cudacore's", id))
	}
	return g, nil
}

// graphStream resolves the stream a graph runs on: a stream of the graph's device.
func graphStream(op string, g *stream.Graph, ordinal, handle int) (*stream.Stream, error) {
	if ordinal != g.Manager().Device().Ordinal() {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"%s belongs to device %d, not device %d; launch it on a stream of its device", g, g.Manager().Device().Ordinal(), ordinal))
	}
	_, s, err := streamOf(op, ordinal, handle)
	return s, err
}

// GraphInstantiate makes the graph's executable graph (which can take a while for large graphs); it
// returns 0.
//
//cudacore:gil release
func GraphInstantiate(id int) (int, error) {
	return guard("cudacore.graph_instantiate", func() (int, error) {
		g, err := graphOf("cudacore.graph_instantiate", id)
		if err != nil {
			return 0, err
		}
		return 0, g.Instantiate()
	})
}

// GraphDebugDot writes the graph as a Graphviz DOT file at path, with every node's parameters when
// verbose; it returns 0. The file's folder must exist: a path that is empty, holds a NUL, lies in no
// folder or names a folder, pipe or socket is an InvalidValue error that names it, before the driver sees
// it.
//
//cudacore:gil release
func GraphDebugDot(id int, path string, verbose bool) (int, error) {
	return guard("cudacore.graph_debug_dot", func() (int, error) {
		const op = "cudacore.graph_debug_dot"
		g, err := graphOf(op, id)
		if err != nil {
			return 0, err
		}
		if path == "" || strings.ContainsRune(path, 0) {
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
				"path %q is not a file name: give the DOT file's path", path))
		}
		if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
			why := "does not exist"
			switch {
			case err == nil:
				why = "is not a folder"
			case !errors.Is(err, fs.ErrNotExist):
				why = "cannot be looked up: " + err.Error() // too long a name, a folder not searchable
			}
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
				"cannot write %q: its folder %q %s", path, filepath.Dir(path), why))
		}
		// The driver opens the file itself and writes it while the graph is locked: a pipe with no reader
		// would block there, and every launch and destroy of the graph behind it.
		if st, err := os.Stat(path); err == nil && st.Mode()&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDir) != 0 {
			kind := "pipe or socket"
			if st.IsDir() {
				kind = "folder"
			}
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("cannot write %q: it is a %s, not a file", path, kind))
		}
		return 0, g.DebugDot(path, verbose)
	})
}

// GraphUpload uploads the graph to the device on a stream; it returns 0.
//
//cudacore:gil hold
//cudacore:door hot
func GraphUpload(id, ordinal, streamHandle int) (int, error) {
	return guard("cudacore.graph_upload", func() (int, error) {
		g, err := graphOf("cudacore.graph_upload", id)
		if err != nil {
			return 0, err
		}
		s, err := graphStream("cudacore.graph_upload", g, ordinal, streamHandle)
		if err != nil {
			return 0, err
		}
		return 0, g.Upload(s)
	})
}

// GraphLaunch launches the graph on a stream. It returns the executable graph's handle for the direct
// path (cudacore/native/direct.c) to launch from then on, or 0 when every launch must come here
// (stream.Graph.DirectExec).
//
//cudacore:gil hold
//cudacore:door hot
func GraphLaunch(id, ordinal, streamHandle int) (int, error) {
	return guard("cudacore.graph_launch", func() (int, error) {
		g, err := graphOf("cudacore.graph_launch", id)
		if err != nil {
			return 0, err
		}
		s, err := graphStream("cudacore.graph_launch", g, ordinal, streamHandle)
		if err != nil {
			return 0, err
		}
		if err := g.Launch(s); err != nil {
			return 0, err
		}
		return int(g.DirectExec()), nil
	})
}

// GraphUpdate updates graph id's executable graph with the parameters of graph other, of the same
// topology; it returns 0.
//
//cudacore:gil release
func GraphUpdate(id, other int) (int, error) {
	return guard("cudacore.graph_update", func() (int, error) {
		g, err := graphOf("cudacore.graph_update", id)
		if err != nil {
			return 0, err
		}
		o, err := graphOf("cudacore.graph_update", other)
		if err != nil {
			return 0, err
		}
		return 0, g.Update(o)
	})
}

// GraphDestroy destroys the graph and forgets its number (doing nothing if it is gone already); it
// returns 0.
//
//cudacore:gil hold
func GraphDestroy(id int) (int, error) {
	return guard("cudacore.graph_destroy", func() (int, error) {
		g, ok := process.Graphs.Get(id)
		if !ok {
			return 0, nil
		}
		// Forget the number only once the driver destroyed the graph: a failure can be retried.
		if err := g.Destroy(); err != nil {
			return 0, err
		}
		process.Graphs.Remove(id)
		return 0, nil
	})
}

// GraphVoided returns, comma-separated, the graph memory of the device that became void since the last
// call, each as "address:token": allocated during a capture that was then aborted, or in a graph
// destroyed before its first launch, so the driver never allocated it (stream.Manager.TakeVoided). The
// token is the owner token that went stale with it (0: none). The Python layer marks closed the Buffer at
// each address that carries that token; a newer Buffer at the same address has another token and stays
// open. The frees of void memory are no-ops meanwhile.
//
//cudacore:gil hold
func GraphVoided(ordinal int) (string, error) {
	return guard("cudacore.graph_voided", func() (string, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		voided := d.Streams().TakeVoided()
		parts := make([]string, len(voided))
		for i, v := range voided {
			parts[i] = strconv.FormatUint(uint64(v.Ptr), 10) + ":" + strconv.FormatUint(v.Token, 10)
		}
		return strings.Join(parts, ","), nil
	})
}

// GraphForgetVoid tells Go that the owners of these void addresses ("address:token", comma-separated, as
// GraphVoided gave them) let go for good: the Python layer marked their Buffers closed, so no free of
// them will come, and Go stops keeping them (void entries keep every free on the graph-aware path and
// the recycle log off). It returns how many were still void on those owners' account.
//
//cudacore:gil hold
func GraphForgetVoid(ordinal int, voided string) (int, error) {
	return guard("cudacore.graph_forget_void", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, part := range strings.Split(voided, ",") {
			if part == "" {
				continue
			}
			addr, tok, found := strings.Cut(part, ":")
			p, perr := strconv.ParseUint(addr, 10, 64)
			t, terr := strconv.ParseUint(tok, 10, 64)
			if !found || perr != nil || terr != nil {
				return n, cuda.NewError("cudacore.graph_forget_void", cuda.ErrorInvalidValue,
					fmt.Sprintf("not an address:token pair: %q", part))
			}
			if d.Streams().ForgetVoid(cuda.DevicePtr(p), t) {
				n++
			}
		}
		return n, nil
	})
}

// GraphInfo returns JSON {device, node_count, allocations, memory_held, instantiated}.
//
//cudacore:gil hold
func GraphInfo(id int) (string, error) {
	return guard("cudacore.graph_info", func() (string, error) {
		g, err := graphOf("cudacore.graph_info", id)
		if err != nil {
			return "", err
		}
		escapes, escaped := g.Escapes()
		b, err := json.Marshal(map[string]any{"device": g.Manager().Device().Ordinal(), "node_count": g.NodeCount(),
			"allocations": g.Allocations(), "memory_held": g.MemoryHeld(), "instantiated": g.Instantiated(),
			"escapes": escapes, "escaped": escaped})
		return string(b), err
	})
}
