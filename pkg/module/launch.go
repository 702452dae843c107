package module

import (
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Function is a kernel of a loaded Module.
type Function struct {
	mod         *Module
	name        string
	handle      cuda.Function
	attrs       Attributes
	params      []Param
	paramsKnown bool
	closed      atomic.Bool
}

// Name returns the kernel's name.
func (f *Function) Name() string { return f.name }

// Handle returns the driver's function handle.
func (f *Function) Handle() cuda.Function { return f.handle }

// ParamsKnown says whether the kernel's parameters are known (from its PTX), so that a caller can pack
// arguments for it without Launch's check.
func (f *Function) ParamsKnown() bool { return f.paramsKnown }

// Attributes returns what the driver reported about the kernel when it was looked up.
func (f *Function) Attributes() Attributes { return f.attrs }

// Params returns the kernel's parameters from its PTX declaration, and whether they are known (they are
// not for a kernel from a cubin or fatbin).
func (f *Function) Params() ([]Param, bool) { return slices.Clone(f.params), f.paramsKnown }

// Config is how a kernel is launched.
type Config struct {
	Grid, Block cuda.Dim3
	SharedMem   uint32 // dynamic shared memory, bytes
	Stream      cuda.Stream
}

func dim(d cuda.Dim3) string { return fmt.Sprintf("(%d, %d, %d)", d[0], d[1], d[2]) }

func dimi(d [3]int) string { return fmt.Sprintf("(%d, %d, %d)", d[0], d[1], d[2]) }

func threads(d cuda.Dim3) uint64 { return uint64(d[0]) * uint64(d[1]) * uint64(d[2]) }

// describe is the launch configuration, the kernel's resources and the device's limits, for messages.
func (f *Function) describe(c Config) string {
	a, d := f.attrs, f.mod.dev
	return fmt.Sprintf("launch of %s with grid %s, block %s (%s threads), %s bytes of dynamic shared memory. "+
		"The kernel uses %d registers per thread, %s bytes of static shared memory and %s bytes of local memory "+
		"per thread, and allows at most %d threads per block and %s bytes of dynamic shared memory. "+
		"Device %d (%s) allows %d threads per block, block dimensions up to %s, grid dimensions up to %s, "+
		"%s bytes of shared memory per block (%s with opt-in) and %s registers per block",
		f.name, dim(c.Grid), dim(c.Block), commas(threads(c.Block)), commas(uint64(c.SharedMem)),
		a.NumRegs, commas(uint64(a.SharedSizeBytes)), commas(uint64(a.LocalSizeBytes)),
		a.MaxThreadsPerBlock, commas(uint64(a.MaxDynamicSharedSizeBytes)),
		d.Ordinal, d.Name, d.MaxThreadsPerBlock, dimi(d.MaxBlockDim), dimi(d.MaxGridDim),
		commas(uint64(d.MaxSharedMemoryPerBlock)), commas(uint64(d.MaxSharedOptin)),
		commas(uint64(d.MaxRegistersPerBlock)))
}

func launchFields(c Config) []cuda.Field {
	return []cuda.Field{
		{Key: "grid", Value: fmt.Sprintf("%d,%d,%d", c.Grid[0], c.Grid[1], c.Grid[2])},
		{Key: "block", Value: fmt.Sprintf("%d,%d,%d", c.Block[0], c.Block[1], c.Block[2])},
		{Key: "shared_mem", Value: strconv.FormatUint(uint64(c.SharedMem), 10)},
	}
}

// Validate checks a launch configuration against the device and the kernel without calling the driver.
// A block, grid or shared memory size out of range is an InvalidValue error (what the driver returns for
// them, docs/contributing/driver-facts.md); a block that needs more registers than the device has is
// LAUNCH_OUT_OF_RESOURCES. Each message says what to change and carries the whole configuration.
func (f *Function) Validate(c Config) error {
	a, d := f.attrs, f.mod.dev
	fail := func(r cuda.Result, why string) error {
		return cuda.NewError("cudacore.launch", r, why+". "+f.describe(c), launchFields(c)...)
	}
	axes := "xyz"
	for i := range 3 {
		if c.Block[i] == 0 {
			return fail(cuda.ErrorInvalidValue, fmt.Sprintf("block dimension %c is 0; every dimension must be at least 1", axes[i]))
		}
		if c.Grid[i] == 0 {
			return fail(cuda.ErrorInvalidValue, fmt.Sprintf("grid dimension %c is 0; every dimension must be at least 1", axes[i]))
		}
		if d.MaxBlockDim[i] > 0 && uint64(c.Block[i]) > uint64(d.MaxBlockDim[i]) {
			return fail(cuda.ErrorInvalidValue, fmt.Sprintf("block dimension %c is %d, above the device's maximum %d",
				axes[i], c.Block[i], d.MaxBlockDim[i]))
		}
		if d.MaxGridDim[i] > 0 && uint64(c.Grid[i]) > uint64(d.MaxGridDim[i]) {
			return fail(cuda.ErrorInvalidValue, fmt.Sprintf("grid dimension %c is %d, above the device's maximum %d",
				axes[i], c.Grid[i], d.MaxGridDim[i]))
		}
	}
	n := threads(c.Block)
	if d.MaxThreadsPerBlock > 0 && n > uint64(d.MaxThreadsPerBlock) {
		return fail(cuda.ErrorInvalidValue, fmt.Sprintf("the block has %s threads, above the device's maximum of %d "+
			"threads per block; use smaller blocks and more of them", commas(n), d.MaxThreadsPerBlock))
	}
	if a.MaxThreadsPerBlock > 0 && n > uint64(a.MaxThreadsPerBlock) {
		return fail(cuda.ErrorInvalidValue, fmt.Sprintf("the block has %s threads, above the %d that this kernel allows "+
			"(its register use or __launch_bounds__ limit it); use smaller blocks", commas(n), a.MaxThreadsPerBlock))
	}
	total := uint64(c.SharedMem) + uint64(a.SharedSizeBytes)
	if d.MaxSharedOptin > 0 && total > uint64(d.MaxSharedOptin) {
		return fail(cuda.ErrorInvalidValue, fmt.Sprintf("the block needs %s bytes of shared memory (%s dynamic + %s static), "+
			"above the device's maximum of %s per block", commas(total), commas(uint64(c.SharedMem)),
			commas(uint64(a.SharedSizeBytes)), commas(uint64(d.MaxSharedOptin))))
	}
	if a.MaxDynamicSharedSizeBytes > 0 && c.SharedMem > uint32(a.MaxDynamicSharedSizeBytes) {
		return fail(cuda.ErrorInvalidValue, fmt.Sprintf("%s bytes of dynamic shared memory is above the %s this kernel "+
			"allows (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; raising it needs cuFuncSetAttribute, which "+
			"cudacore does not offer yet); use at most %s bytes", commas(uint64(c.SharedMem)),
			commas(uint64(a.MaxDynamicSharedSizeBytes)), commas(uint64(a.MaxDynamicSharedSizeBytes))))
	}
	if regs := uint64(a.NumRegs) * n; d.MaxRegistersPerBlock > 0 && regs > uint64(d.MaxRegistersPerBlock) {
		return fail(cuda.ErrorLaunchOutOfResources, fmt.Sprintf("the block needs %s registers (%d per thread x %s threads), "+
			"above the device's %s per block; use at most %d threads per block", commas(regs), a.NumRegs,
			commas(n), commas(uint64(d.MaxRegistersPerBlock)), uint64(d.MaxRegistersPerBlock)/uint64(a.NumRegs)))
	}
	return nil
}

// Launch validates the configuration and the arguments and launches the kernel (cuLaunchKernel). It is
// asynchronous: errors from the kernel's execution surface at a later synchronization.
func (f *Function) Launch(c Config, args []Arg) error {
	if f.closed.Load() {
		return closedError("the module of kernel " + f.name)
	}
	if err := f.Validate(c); err != nil {
		return err
	}
	if f.paramsKnown {
		if err := CheckArgs(f.name, f.params, args); err != nil {
			return err
		}
	}
	params := make([][]byte, len(args))
	size := 0
	for i, a := range args {
		params[i] = a.Bytes
		size += len(a.Bytes)
	}
	if size > maxParams {
		return cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue,
			fmt.Sprintf("the arguments of %s take %s bytes; a launch passes at most %s", f.name, commas(uint64(size)), commas(maxParams)))
	}
	err := f.mod.drv.LaunchKernel(f.mod.ctx, f.handle, c.Grid, c.Block, c.SharedMem, c.Stream, params)
	if err == nil {
		return nil
	}
	return f.explainLaunch(err, c)
}

func (f *Function) explainLaunch(err error, c Config) error {
	var advice string
	switch cuda.ResultOf(err) {
	case cuda.ErrorLaunchOutOfResources:
		advice = "the launch needs more registers or shared memory than a multiprocessor has: use fewer threads " +
			"per block or less shared memory, or compile the kernel with fewer registers (-maxrregcount or __launch_bounds__)"
	case cuda.ErrorInvalidValue:
		advice = "the driver refused the launch configuration or the arguments: check the block and grid " +
			"dimensions, the shared memory size and the number and sizes of the arguments"
	case cuda.ErrorInvalidClusterSize:
		advice = "the cluster shape does not divide the grid or exceeds the device's cluster limit"
	case cuda.ErrorNotSupported:
		if e, ok := err.(*cuda.Error); ok && e.Msg != "" {
			return rewrap(err, "cannot launch "+f.name, launchFields(c)...)
		}
		advice = "the device or backend cannot launch this kernel"
	default:
		advice = "the launch failed"
	}
	return rewrap(err, advice+". "+f.describe(c), launchFields(c)...)
}

// commas writes v with thousands separators.
func commas(v uint64) string {
	d := strconv.FormatUint(v, 10)
	out := make([]byte, 0, len(d)+len(d)/3)
	for i := range len(d) {
		if i > 0 && (len(d)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, d[i])
	}
	return string(out)
}
