// Package kernels keeps the modules and functions the facade has handed to Python, under integer handles:
// gopy passes ints cheaply and safely, and a handle that was unloaded or never existed is a clear
// InvalidHandle error instead of a dangling pointer. Unload removes a module and its functions, so the
// registry holds nothing the user has let go of.
package kernels

import (
	"fmt"
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/module"
)

// Module is a registered module and the device it was loaded on.
type Module struct {
	*module.Module
	Ordinal int
	funcs   []int64
}

// Function is a registered function and the handle of its module.
type Function struct {
	*module.Function
	Module  int64
	Ordinal int // the device the module was loaded on
}

// Registry maps handles to modules and functions. The zero value is not usable; use New.
type Registry struct {
	mu      sync.Mutex
	next    int64
	modules map[int64]*Module
	funcs   map[int64]*Function
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{modules: map[int64]*Module{}, funcs: map[int64]*Function{}}
}

// Default is the process's registry, used by the facade.
var Default = New()

// invalid is the error for a handle that is not registered; the caller holds r.mu. Handles are never
// reused, so one this registry handed out was unloaded: that is a closed object (CUDACORE_ERROR_CLOSED);
// any other was never a handle of ours.
func (r *Registry) invalid(kind string, h int64) error {
	if h > 0 && h <= r.next {
		return cuda.NewError("cudacore."+kind, cuda.ErrorClosed,
			fmt.Sprintf("%s handle %d was unloaded (its module was unloaded); load the module again", kind, h))
	}
	return cuda.NewError("cudacore."+kind, cuda.ErrorInvalidHandle,
		fmt.Sprintf("%s handle %d is not a loaded %s: cudacore never handed it out", kind, h, kind))
}

// AddModule registers m and returns its handle.
func (r *Registry) AddModule(m *module.Module, ordinal int) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.modules[r.next] = &Module{Module: m, Ordinal: ordinal}
	return r.next
}

// Module returns the module with handle h.
func (r *Registry) Module(h int64) (*Module, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.modules[h]; ok {
		return m, nil
	}
	return nil, r.invalid("module", h)
}

// Function looks up name in module mh and registers it. Looking up the same name twice returns the same
// handle.
func (r *Registry) Function(mh int64, name string) (int64, error) {
	m, err := r.Module(mh)
	if err != nil {
		return 0, err
	}
	f, err := m.Function(name) // may call the driver: outside the registry's lock
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.modules[mh] != m {
		return 0, r.invalid("module", mh)
	}
	for _, h := range m.funcs {
		if r.funcs[h].Function == f {
			return h, nil
		}
	}
	r.next++
	r.funcs[r.next] = &Function{Function: f, Module: mh, Ordinal: m.Ordinal}
	m.funcs = append(m.funcs, r.next)
	return r.next, nil
}

// Func returns the function with handle h.
func (r *Registry) Func(h int64) (*Function, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.funcs[h]; ok {
		return f, nil
	}
	return nil, r.invalid("function", h)
}

// Unload removes module h and its functions from the registry and unloads it from the driver.
func (r *Registry) Unload(h int64) error {
	r.mu.Lock()
	m, ok := r.modules[h]
	if !ok {
		err := r.invalid("module", h)
		r.mu.Unlock()
		return err
	}
	delete(r.modules, h)
	for _, fh := range m.funcs {
		delete(r.funcs, fh)
	}
	r.mu.Unlock()
	return m.Unload()
}

// Len returns how many modules and functions are registered.
func (r *Registry) Len() (modules, funcs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.modules), len(r.funcs)
}
