// Package module loads kernel images (PTX, cubin, fatbin), looks up their functions and launches them, with
// validation before the driver and errors that explain the driver's refusals.
//
// The driver does not report a kernel's parameter list, so for PTX the .entry declarations are parsed
// (ParsePTX) and every launch's arguments are checked against them; for binaries only what the driver
// reports is checked.
package module

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Kind is what a kernel image is.
type Kind string

const (
	KindPTX     Kind = "ptx"
	KindCubin   Kind = "cubin"
	KindFatbin  Kind = "fatbin"
	KindUnknown Kind = "unknown"
)

var (
	elfMagic    = []byte("\x7fELF")
	fatbinMagic = []byte{0x50, 0xED, 0x55, 0xBA} // 0xBA55ED50, little endian
)

// DetectKind says what image is from its first bytes: an ELF header is a cubin, the fatbin magic a fatbin,
// and UTF-8 text whose first directive is .version (after comments and blank lines) PTX.
func DetectKind(image []byte) Kind {
	switch {
	case bytes.HasPrefix(image, elfMagic):
		return KindCubin
	case bytes.HasPrefix(image, fatbinMagic):
		return KindFatbin
	}
	text := bytes.TrimRight(image, "\x00")
	if len(text) == 0 || bytes.IndexByte(text, 0) >= 0 || !utf8.Valid(text) {
		return KindUnknown
	}
	toks := tokenize(string(text))
	if len(toks) > 0 && toks[0] == ".version" {
		return KindPTX
	}
	return KindUnknown
}

// DeviceLimits are the device attributes a launch is validated against.
type DeviceLimits struct {
	Ordinal                 int    `json:"ordinal"`
	Name                    string `json:"name"`
	MaxThreadsPerBlock      int    `json:"max_threads_per_block"`
	MaxBlockDim             [3]int `json:"max_block_dim"`
	MaxGridDim              [3]int `json:"max_grid_dim"`
	MaxSharedMemoryPerBlock int    `json:"max_shared_memory_per_block"`
	MaxSharedOptin          int    `json:"max_shared_memory_per_block_optin"`
	MaxRegistersPerBlock    int    `json:"max_registers_per_block"`
	ComputeCapability       [2]int `json:"compute_capability"`
}

// QueryDeviceLimits reads the DeviceLimits of dev.
func QueryDeviceLimits(drv cuda.Driver, dev cuda.Device, ordinal int) (DeviceLimits, error) {
	l := DeviceLimits{Ordinal: ordinal}
	var err error
	if l.Name, err = drv.DeviceName(dev); err != nil {
		return l, err
	}
	for _, a := range []struct {
		attr cuda.DeviceAttribute
		dst  *int
	}{
		{cuda.AttrMaxThreadsPerBlock, &l.MaxThreadsPerBlock},
		{cuda.AttrMaxBlockDimX, &l.MaxBlockDim[0]},
		{cuda.AttrMaxBlockDimY, &l.MaxBlockDim[1]},
		{cuda.AttrMaxBlockDimZ, &l.MaxBlockDim[2]},
		{cuda.AttrMaxGridDimX, &l.MaxGridDim[0]},
		{cuda.AttrMaxGridDimY, &l.MaxGridDim[1]},
		{cuda.AttrMaxGridDimZ, &l.MaxGridDim[2]},
		{cuda.AttrMaxSharedMemoryPerBlock, &l.MaxSharedMemoryPerBlock},
		{cuda.AttrMaxSharedMemoryPerBlockOptin, &l.MaxSharedOptin},
		{cuda.AttrMaxRegistersPerBlock, &l.MaxRegistersPerBlock},
		{cuda.AttrComputeCapabilityMajor, &l.ComputeCapability[0]},
		{cuda.AttrComputeCapabilityMinor, &l.ComputeCapability[1]},
	} {
		if *a.dst, err = drv.DeviceAttribute(dev, a.attr); err != nil {
			return l, err
		}
	}
	return l, nil
}

// Module is a loaded kernel image in one context. Unload it when done.
type Module struct {
	drv     cuda.Driver
	ctx     cuda.Context
	dev     DeviceLimits
	handle  cuda.Module
	kind    Kind
	size    int
	entries []Entry // from the PTX text; nil for binaries
	header  string  // the PTX's .version and .target, for messages

	mu     sync.Mutex
	funcs  map[string]*Function
	closed bool
}

// Load loads image into ctx (cuModuleLoadData). PTX gets the terminating NUL the driver requires. Data that
// is none of the known kinds, or that the driver rejects as an image, is an InvalidImage error naming the
// kind detected.
func Load(drv cuda.Driver, ctx cuda.Context, dev DeviceLimits, image []byte) (*Module, error) {
	kind := DetectKind(image)
	if kind == KindUnknown {
		return nil, cuda.NewError("cudacore.load_module", cuda.ErrorInvalidImage,
			fmt.Sprintf("the %d-byte image is not PTX (text starting with a .version directive), a cubin (ELF) "+
				"or a fatbin; it starts with %s", len(image), preview(image)),
			cuda.Field{Key: "kind", Value: string(kind)}, cuda.Field{Key: "size", Value: strconv.Itoa(len(image))})
	}
	m := &Module{drv: drv, ctx: ctx, dev: dev, kind: kind, size: len(image), funcs: map[string]*Function{}}
	data := image
	if kind == KindPTX {
		text := string(bytes.TrimRight(image, "\x00"))
		m.entries, _ = ParsePTX(text)
		m.header = ptxHeader(text)
		if !bytes.HasSuffix(image, []byte{0}) {
			data = append(slices.Clip(image), 0)
		}
	}
	h, err := drv.ModuleLoadData(ctx, data)
	if err != nil {
		return nil, explainLoad(err, m)
	}
	m.handle = h
	return m, nil
}

// ptxHeader renders the .version and .target directives of PTX text: ".version 8.0, .target sm_90".
func ptxHeader(text string) string {
	var parts []string
	for _, re := range []*regexp.Regexp{ptxVersionRe, ptxTargetRe} {
		if m := re.FindStringSubmatch(text); m != nil {
			parts = append(parts, strings.TrimSpace(m[0]))
		}
	}
	if len(parts) == 0 {
		return "no .version or .target"
	}
	return strings.Join(parts, ", ")
}

var (
	ptxVersionRe = regexp.MustCompile(`\.version[ \t]+[0-9.]+`)
	ptxTargetRe  = regexp.MustCompile(`\.target[ \t]+[A-Za-z0-9_, \t]+`)
)

func preview(b []byte) string {
	n := min(len(b), 16)
	if n == 0 {
		return "nothing (it is empty)"
	}
	if utf8.Valid(b[:n]) && bytes.IndexByte(b[:n], 0) < 0 {
		return strconv.Quote(string(b[:n]))
	}
	return fmt.Sprintf("the bytes % x", b[:n])
}

func explainLoad(err error, m *Module) error {
	r := cuda.ResultOf(err)
	what := fmt.Sprintf("loading a %d-byte %s image", m.size, m.kind)
	switch r {
	case cuda.ErrorInvalidImage, cuda.ErrorInvalidPTX, cuda.ErrorNoBinaryForGpu, cuda.ErrorInvalidSource,
		cuda.ErrorUnsupportedPTXVersion:
		what += fmt.Sprintf(" on device %d (%s)", m.dev.Ordinal, m.dev.Name)
		if m.kind == KindPTX {
			what += fmt.Sprintf(": the PTX declares %s; the device is compute capability %d.%d (sm_%d%d). "+
				"Check the PTX's .version against the driver and its .target against the device",
				m.header, m.dev.ComputeCapability[0], m.dev.ComputeCapability[1],
				m.dev.ComputeCapability[0], m.dev.ComputeCapability[1])
		} else {
			what += ": the image has no code for this device's architecture, or is damaged"
		}
	}
	return rewrap(err, what, cuda.Field{Key: "kind", Value: string(m.kind)})
}

// rewrap returns a new *cuda.Error with err's operation, Result and fields, msg, then the driver's own
// message if it had one.
func rewrap(err error, msg string, fields ...cuda.Field) error {
	e, ok := err.(*cuda.Error)
	if !ok {
		return &cuda.Error{Op: "cudacore.module", Result: cuda.ResultOf(err), Msg: msg, Fields: fields, Err: err}
	}
	if e.Msg != "" {
		msg += " (driver: " + e.Msg + ")"
	}
	return &cuda.Error{Op: e.Op, Result: e.Result, Msg: msg, Fields: append(fields, e.Fields...), Err: e.Err}
}

// Kind returns what the image was.
func (m *Module) Kind() Kind { return m.kind }

// Handle returns the driver's module handle.
func (m *Module) Handle() cuda.Module { return m.handle }

// Entries returns the kernels the PTX declares, with their parameters; nil for a binary image.
func (m *Module) Entries() []Entry { return slices.Clone(m.entries) }

func (m *Module) entry(name string) *Entry {
	for i := range m.entries {
		if m.entries[i].Name == name {
			return &m.entries[i]
		}
	}
	return nil
}

// Unload unloads the module (cuModuleUnload); its functions become unusable. A second Unload does nothing.
func (m *Module) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	for _, f := range m.funcs {
		f.closed.Store(true)
	}
	return m.drv.ModuleUnload(m.ctx, m.handle)
}

func closedError(what string) error {
	return cuda.NewError("cudacore.module", cuda.ErrorClosed, what+" was unloaded")
}

// Function looks up the kernel called name (cuModuleGetFunction) and reads its attributes. Unknown names
// are a NotFound error that lists the kernels the PTX declares.
func (m *Module) Function(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, closedError("the module")
	}
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	h, err := m.drv.ModuleGetFunction(m.ctx, m.handle, name)
	if err != nil {
		if cuda.ResultOf(err) != cuda.ErrorNotFound {
			return nil, rewrap(err, fmt.Sprintf("looking up kernel %q", name))
		}
		msg := fmt.Sprintf("the %s module has no kernel %q", m.kind, name)
		if m.entries != nil {
			names := make([]string, len(m.entries))
			for i, e := range m.entries {
				names[i] = e.Name
			}
			if len(names) == 0 {
				msg += "; it declares no .entry kernels"
			} else {
				msg += "; its kernels are " + strings.Join(names, ", ")
			}
		}
		if strings.ContainsAny(name, "<(") || (m.entries == nil && !strings.HasPrefix(name, "_Z")) {
			msg += " (C++ kernels have mangled names unless declared extern \"C\")"
		}
		return nil, rewrap(err, msg, cuda.Field{Key: "name", Value: name})
	}
	f := &Function{mod: m, name: name, handle: h}
	if e := m.entry(name); e != nil && e.Complete {
		f.params = slices.Clone(e.Params)
		f.paramsKnown = true
	}
	if f.attrs, err = readAttributes(m.drv, m.ctx, h); err != nil {
		return nil, rewrap(err, fmt.Sprintf("reading the attributes of kernel %q", name))
	}
	m.funcs[name] = f
	return f, nil
}

// Attributes are what the driver reports about a compiled kernel (cuFuncGetAttribute).
type Attributes struct {
	NumRegs                   int `json:"num_regs"`
	SharedSizeBytes           int `json:"shared_size_bytes"`
	ConstSizeBytes            int `json:"const_size_bytes"`
	LocalSizeBytes            int `json:"local_size_bytes"`
	MaxThreadsPerBlock        int `json:"max_threads_per_block"`
	PTXVersion                int `json:"ptx_version"`
	BinaryVersion             int `json:"binary_version"`
	MaxDynamicSharedSizeBytes int `json:"max_dynamic_shared_size_bytes"`
}

func readAttributes(drv cuda.Driver, ctx cuda.Context, f cuda.Function) (Attributes, error) {
	var a Attributes
	for _, x := range []struct {
		attr cuda.FunctionAttribute
		dst  *int
	}{
		{cuda.FuncAttrNumRegs, &a.NumRegs},
		{cuda.FuncAttrSharedSizeBytes, &a.SharedSizeBytes},
		{cuda.FuncAttrConstSizeBytes, &a.ConstSizeBytes},
		{cuda.FuncAttrLocalSizeBytes, &a.LocalSizeBytes},
		{cuda.FuncAttrMaxThreadsPerBlock, &a.MaxThreadsPerBlock},
		{cuda.FuncAttrPTXVersion, &a.PTXVersion},
		{cuda.FuncAttrBinaryVersion, &a.BinaryVersion},
		{cuda.FuncAttrMaxDynamicSharedSizeBytes, &a.MaxDynamicSharedSizeBytes},
	} {
		v, err := drv.FuncGetAttribute(ctx, f, x.attr)
		if err != nil {
			return a, err
		}
		*x.dst = v
	}
	return a, nil
}
