package cudasim

import (
	"bytes"
	"debug/elf"
	"regexp"
	"strconv"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// CtxSetLimit implements cuCtxSetLimit as measured on the H100: the malloc heap clamps silently to
// heapClampNum/heapClampDen of the device's memory (17,681,179,680 bytes there); a persisting L2 size
// above the device's maximum is CUDA_ERROR_INVALID_VALUE; the device runtime sync depth is unsupported
// from compute capability 9.0 (CDP2); an unknown limit is CUDA_ERROR_INVALID_VALUE. Since no kernel runs,
// the "heap is fixed once a kernel called malloc" rule never applies.
func (d *Driver) CtxSetLimit(c cuda.Context, l cuda.Limit, val uint64) error {
	const op = "cuCtxSetLimit"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := v.limitSupported(op, l); err != nil {
		return err
	}
	switch l {
	case cuda.LimitMallocHeapSize:
		val = min(val, v.heapMax())
	case cuda.LimitPersistingL2CacheSize:
		top := v.maxPersistingL2()
		if val > top {
			return errf(op, cuda.ErrorInvalidValue, "%d bytes is above the device's persisting L2 maximum of %d", val, top)
		}
		// The H100 rounds up to tenths of the maximum: 1 MiB was applied as 3,276,800 (of 32,768,000).
		step := top / 10
		val = min((val+step-1)/step*step, top)
	case cuda.LimitStackSize:
		val = (val + 15) &^ 15 // the H100 applied 1,000 bytes as 1,008: 16-byte granules
	case cuda.LimitMaxL2FetchGranularity:
		val = min(val, 128)
	}
	v.limits[l] = val
	return nil
}

func (v *device) limitSupported(op string, l cuda.Limit) error {
	if _, ok := v.limits[l]; !ok {
		return errf(op, cuda.ErrorInvalidValue, "limit %d is not a CUlimit", l)
	}
	if (l == cuda.LimitPersistingL2CacheSize && v.maxPersistingL2() == 0) ||
		(l == cuda.LimitDevRuntimeSyncDepth && v.cfg.ComputeCapability[0] >= 9) {
		return errf(op, cuda.ErrorUnsupportedLimit, "limit %d is not supported by device %d", l, v.index)
	}
	return nil
}

func (d *Driver) CtxGetLimit(c cuda.Context, l cuda.Limit) (uint64, error) {
	const op = "cuCtxGetLimit"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if err := v.limitSupported(op, l); err != nil {
		return 0, err
	}
	return v.limits[l], nil
}

type module struct {
	names      map[string]bool
	anyName    bool // a binary image whose kernels could not be listed: every name resolves
	ptxVersion int  // 10*major+minor of the PTX ISA, 0 for binaries
	funcs      map[string]cuda.Function
}

type function struct {
	mod  *module
	name string
}

var (
	ptxEntryRe   = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][A-Za-z0-9_$%]*)\s*\(`)
	ptxVersionRe = regexp.MustCompile(`\.version\s+(\d+)\.(\d+)`)
	ptxTargetRe  = regexp.MustCompile(`\.target\s+sm_(\d+)`)
	fatbinMagic  = []byte{0x50, 0xED, 0x55, 0xBA} // 0xBA55ED50, little endian
	elfMagic     = []byte("\x7fELF")
)

// ModuleLoadData implements cuModuleLoadData with light validation: PTX (text starting with .version or
// a // comment), a cubin (ELF) or a fatbin; anything else is CUDA_ERROR_INVALID_IMAGE. It records the
// kernel names it can find so that ModuleGetFunction can refuse unknown ones.
func (d *Driver) ModuleLoadData(c cuda.Context, image []byte) (cuda.Module, error) {
	const op = "cuModuleLoadData"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	img := bytes.TrimRight(image, "\x00")
	m := &module{names: map[string]bool{}, funcs: map[string]cuda.Function{}}
	text := bytes.TrimLeft(img, " \t\r\n")
	switch {
	case len(img) == 0:
		return 0, errf(op, cuda.ErrorInvalidImage, "the image is empty")
	case bytes.HasPrefix(img, elfMagic):
		elfNames(img, m.names)
		m.anyName = len(m.names) == 0
	case bytes.HasPrefix(img, fatbinMagic):
		ptxNames(img, m.names)
		for i := 0; i < len(img); {
			j := bytes.Index(img[i:], elfMagic)
			if j < 0 {
				break
			}
			elfNames(img[i+j:], m.names)
			i += j + len(elfMagic)
		}
		m.anyName = len(m.names) == 0
	case bytes.HasPrefix(text, []byte(".version")) || bytes.HasPrefix(text, []byte("//")):
		ver := ptxVersionRe.FindSubmatch(text)
		if ver == nil {
			return 0, errf(op, cuda.ErrorInvalidPTX, "the PTX has no .version directive")
		}
		maj, _ := strconv.Atoi(string(ver[1]))
		mnr, _ := strconv.Atoi(string(ver[2]))
		m.ptxVersion = min(maj, 99)*10 + min(mnr, 9)
		if t := ptxTargetRe.FindSubmatch(text); t != nil {
			sm, err := strconv.Atoi(string(t[1]))
			if cc := v.cfg.ComputeCapability; err != nil || sm > cc[0]*10+cc[1] {
				return 0, errf(op, cuda.ErrorInvalidPTX, "the PTX targets sm_%s, newer than the device's compute capability %d.%d", t[1], cc[0], cc[1])
			}
		}
		ptxNames(text, m.names)
	default:
		return 0, errf(op, cuda.ErrorInvalidImage, "the image is neither PTX, a cubin (ELF) nor a fatbin")
	}
	h := cuda.Module(v.handle(kindModuleHandle))
	v.modules[h] = m
	return h, nil
}

func ptxNames(b []byte, into map[string]bool) {
	for _, m := range ptxEntryRe.FindAllSubmatch(b, -1) {
		into[string(m[1])] = true
	}
}

// elfNames adds the function symbols of a cubin. debug/elf is meant to reject bad input with an error,
// but the image is arbitrary user bytes, so a panic in it must not take the process down.
func elfNames(b []byte, into map[string]bool) {
	defer func() { _ = recover() }()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return
	}
	syms, err := f.Symbols()
	if err != nil {
		return
	}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Name != "" {
			into[s.Name] = true
		}
	}
}

func (d *Driver) ModuleUnload(c cuda.Context, mh cuda.Module) error {
	const op = "cuModuleUnload"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	m := v.modules[mh]
	if m == nil {
		return errf(op, cuda.ErrorInvalidHandle, "module %#x is not a loaded module of device %d", uint64(mh), v.index)
	}
	for _, f := range m.funcs {
		delete(v.funcs, f)
	}
	delete(v.modules, mh)
	return nil
}

func (d *Driver) ModuleGetFunction(c cuda.Context, mh cuda.Module, name string) (cuda.Function, error) {
	const op = "cuModuleGetFunction"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	m := v.modules[mh]
	if m == nil {
		return 0, errf(op, cuda.ErrorInvalidHandle, "module %#x is not a loaded module of device %d", uint64(mh), v.index)
	}
	if h, ok := m.funcs[name]; ok {
		return h, nil
	}
	if !m.names[name] && !m.anyName {
		return 0, errf(op, cuda.ErrorNotFound, "the module has no kernel %q", name)
	}
	h := cuda.Function(v.handle(kindFuncHandle))
	m.funcs[name] = h
	v.funcs[h] = &function{mod: m, name: name}
	return h, nil
}

func (d *Driver) FuncGetAttribute(c cuda.Context, fh cuda.Function, a cuda.FunctionAttribute) (int, error) {
	const op = "cuFuncGetAttribute"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	f := v.funcs[fh]
	if f == nil {
		return 0, errf(op, cuda.ErrorInvalidHandle, "function %#x is not a function of a loaded module", uint64(fh))
	}
	cc := v.cfg.ComputeCapability[0]*10 + v.cfg.ComputeCapability[1]
	switch a {
	case cuda.FuncAttrMaxThreadsPerBlock:
		return 1024, nil
	case cuda.FuncAttrSharedSizeBytes, cuda.FuncAttrConstSizeBytes, cuda.FuncAttrLocalSizeBytes:
		return 0, nil
	case cuda.FuncAttrNumRegs:
		return 16, nil
	case cuda.FuncAttrPTXVersion, cuda.FuncAttrBinaryVersion:
		// Both read as the device's architecture: what a PTX module is JIT-compiled for.
		return cc, nil
	case cuda.FuncAttrMaxDynamicSharedSizeBytes:
		return 49152, nil
	}
	return 0, errf(op, cuda.ErrorInvalidValue, "function attribute %d is not one the simulator models", a)
}

// LaunchKernel validates the function and stream and then refuses: the simulator has no device to run
// code on. Code that must run kernels needs the real driver.
func (d *Driver) LaunchKernel(c cuda.Context, fh cuda.Function, grid, block cuda.Dim3, sharedMem uint32, sh cuda.Stream, params [][]byte) error {
	const op = "cuLaunchKernel"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if v.funcs[fh] == nil {
		return errf(op, cuda.ErrorInvalidHandle, "function %#x is not a function of a loaded module", uint64(fh))
	}
	if _, err := d.resolve(op, v, sh); err != nil {
		return err
	}
	// Measured: an oversized block or too much dynamic shared memory is INVALID_VALUE, not
	// LAUNCH_OUT_OF_RESOURCES.
	threads := uint64(block[0]) * uint64(block[1]) * uint64(block[2])
	if threads == 0 || threads > 1024 || block[2] > 64 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0 ||
		grid[1] > 65535 || grid[2] > 65535 || grid[0] > 2147483647 || sharedMem > 232448 {
		return errf(op, cuda.ErrorInvalidValue, "grid %v, block %v (%d threads) or %d bytes of shared memory is beyond the device's limits", grid, block, threads, sharedMem)
	}
	return cuda.NewError(op, cuda.ErrorNotSupported, "the simulator does not run device code")
}
