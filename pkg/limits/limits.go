// Package limits gets and sets a device context's limits (cuCtxGetLimit / cuCtxSetLimit) by name, and
// tells the truth about what the driver did.
//
// The driver clamps some requests silently: on the H100 of docs/contributing/driver-facts.md, a 64 TiB malloc heap returns
// CUDA_SUCCESS and reads back 17,681,179,680 bytes. So Set validates before it calls the driver, reads the
// value back after, and reports any difference: as Applied.Clamped, or as an error in strict mode.
package limits

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Unit says what a limit's value counts.
type Unit string

const (
	Bytes    Unit = "bytes"
	Levels   Unit = "levels"   // nesting depth
	Launches Unit = "launches" // a count of launches
)

// AddressSpace is the most bytes a process can address (its user virtual address space: addrspace_*.go):
// a byte limit above it cannot be meant, whatever the device. Smaller requests that the device cannot
// honour go to the driver, which clamps them; Set reports the clamp.
const AddressSpace uint64 = 1 << addressBits

// MaxStackSize is the architecture's limit on local memory per thread (512 KiB on every compute capability
// since 2.0), which bounds the per-thread stack.
const MaxStackSize uint64 = 512 << 10

// MaxSyncDepth is the deepest nesting the device runtime supports (CUDA programming guide: 24).
const MaxSyncDepth uint64 = 24

// DeviceInfo is what validation needs to know about the device whose limit is set. Zero fields are unknown
// and skip the checks that need them.
type DeviceInfo struct {
	Ordinal                  int
	Name                     string
	TotalMemory              uint64
	L2CacheSize              uint64
	MaxPersistingL2CacheSize uint64
}

// Spec describes one limit.
type Spec struct {
	Name  string     // the name users see: "malloc_heap_size"
	Limit cuda.Limit // the CUlimit
	Unit  Unit
	Doc   string // one line for people
	// Min and Max bound a value (inclusive) independently of the device; Max 0 means no fixed bound.
	Min, Max uint64
	// Allowed, when not empty, is the complete set of values accepted.
	Allowed []uint64
	// Validate, when set, checks a value against the device beyond Min, Max and Allowed. It returns an
	// explanation of what is wrong, or "".
	Validate func(dev DeviceInfo, v uint64) string
}

var specs = []Spec{
	{
		Name: "malloc_heap_size", Limit: cuda.LimitMallocHeapSize, Unit: Bytes,
		Doc: "size of the heap that device-side malloc() and new allocate from; fixed once a kernel that " +
			"uses malloc has run in the process",
		Max: AddressSpace,
	},
	{
		Name: "stack_size", Limit: cuda.LimitStackSize, Unit: Bytes,
		Doc: "stack size of each GPU thread",
		Max: MaxStackSize,
	},
	{
		Name: "printf_fifo_size", Limit: cuda.LimitPrintfFIFOSize, Unit: Bytes,
		Doc: "size of the FIFO that device-side printf() writes to",
		Max: AddressSpace,
	},
	{
		Name: "dev_runtime_sync_depth", Limit: cuda.LimitDevRuntimeSyncDepth, Unit: Levels,
		Doc: "deepest grid nesting at which a device-runtime kernel may synchronize on its children",
		Max: MaxSyncDepth,
	},
	{
		Name: "dev_runtime_pending_launch_count", Limit: cuda.LimitDevRuntimePendingLaunchCount, Unit: Launches,
		Doc: "number of device-runtime launches that may be outstanding at once",
		Min: 1, Max: math.MaxInt32,
	},
	{
		Name: "max_l2_fetch_granularity", Limit: cuda.LimitMaxL2FetchGranularity, Unit: Bytes,
		Doc:     "L2 cache fetch granularity hint, in bytes",
		Allowed: []uint64{0, 32, 64, 128},
	},
	{
		Name: "persisting_l2_cache_size", Limit: cuda.LimitPersistingL2CacheSize, Unit: Bytes,
		Doc: "part of the L2 cache set aside for persisting accesses",
		Validate: func(dev DeviceInfo, v uint64) string {
			// Measured on the H100 (driver 580): a size above CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
			// (32,768,000 bytes there) is refused with CUDA_ERROR_INVALID_VALUE; smaller ones are rounded.
			if dev.MaxPersistingL2CacheSize > 0 && v > dev.MaxPersistingL2CacheSize {
				return fmt.Sprintf("at most %s of the device's %s L2 cache can be set aside for persisting "+
					"accesses (CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)",
					FormatValue(dev.MaxPersistingL2CacheSize, Bytes), HumanBytes(dev.L2CacheSize))
			}
			return ""
		},
	},
}

// Specs returns every limit, in a stable order (the order cudacore doctor shows).
func Specs() []Spec { return slices.Clone(specs) }

// Names returns the names of every limit.
func Names() []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// Lookup returns the limit called name, or an InvalidValue error that lists the valid names.
func Lookup(name string) (Spec, error) {
	for _, s := range specs {
		if s.Name == name {
			return s, nil
		}
	}
	return Spec{}, cuda.NewError("cudacore.limits", cuda.ErrorInvalidValue,
		fmt.Sprintf("unknown limit %q: the limits are %s", name, strings.Join(Names(), ", ")),
		cuda.Field{Key: "limit", Value: name})
}

// Check validates v for s on dev without calling the driver. It returns nil or an InvalidValue error
// whose message says what is allowed.
func (s Spec) Check(dev DeviceInfo, v uint64) error {
	bad := func(why string) error {
		return cuda.NewError("cudacore.limits", cuda.ErrorInvalidValue,
			fmt.Sprintf("%s = %s is not valid: %s", s.Name, FormatValue(v, s.Unit), why),
			cuda.Field{Key: "limit", Value: s.Name}, cuda.Field{Key: "requested", Value: strconv.FormatUint(v, 10)})
	}
	if len(s.Allowed) > 0 && !slices.Contains(s.Allowed, v) {
		vals := make([]string, len(s.Allowed))
		for i, a := range s.Allowed {
			vals[i] = strconv.FormatUint(a, 10)
		}
		return bad("the allowed values are " + strings.Join(vals, ", "))
	}
	if v < s.Min {
		return bad(fmt.Sprintf("the least allowed value is %s", FormatValue(s.Min, s.Unit)))
	}
	if s.Max > 0 && v > s.Max {
		switch s.Max {
		case AddressSpace:
			return bad(fmt.Sprintf("it is larger than the %s a process can address at all (the device has %s)",
				FormatValue(AddressSpace, Bytes), FormatValue(dev.TotalMemory, Bytes)))
		case MaxStackSize:
			return bad(fmt.Sprintf("a thread's stack lives in its local memory, which is at most %s on every GPU",
				FormatValue(MaxStackSize, Bytes)))
		}
		return bad(fmt.Sprintf("the largest allowed value is %s", FormatValue(s.Max, s.Unit)))
	}
	if s.Validate != nil {
		if why := s.Validate(dev, v); why != "" {
			return bad(why)
		}
	}
	return nil
}

// CheckSigned validates a value that arrives as a signed integer (from Python): negative values are an
// InvalidValue error naming the limit.
func CheckSigned(name string, v int64) (uint64, error) {
	if v < 0 {
		return 0, cuda.NewError("cudacore.limits", cuda.ErrorInvalidValue,
			fmt.Sprintf("%s = %d is not valid: a limit cannot be negative", name, v),
			cuda.Field{Key: "limit", Value: name}, cuda.Field{Key: "requested", Value: strconv.FormatInt(v, 10)})
	}
	return uint64(v), nil
}

// Applied is the outcome of a Set: what was asked, what the driver reports after the call, and whether
// they differ.
type Applied struct {
	Name      string `json:"name"`
	Unit      Unit   `json:"unit"`
	Requested uint64 `json:"requested"`
	Applied   uint64 `json:"applied"`
	Previous  uint64 `json:"previous"`
	Clamped   bool   `json:"clamped"`
	// Message, when Clamped, says so for a person with both numbers.
	Message string `json:"message,omitempty"`
}

// Get returns the current value of the named limit in ctx.
func Get(drv cuda.Driver, ctx cuda.Context, dev DeviceInfo, name string) (uint64, error) {
	s, err := Lookup(name)
	if err != nil {
		return 0, err
	}
	v, err := drv.CtxGetLimit(ctx, s.Limit)
	if err != nil {
		return 0, s.explain(dev, err, 0, false)
	}
	return v, nil
}

// All returns every limit's current value by name. A limit the device does not support is left out and
// listed in unsupported.
func All(drv cuda.Driver, ctx cuda.Context) (values map[string]uint64, unsupported []string, err error) {
	values = map[string]uint64{}
	for _, s := range specs {
		v, err := drv.CtxGetLimit(ctx, s.Limit)
		switch {
		case err == nil:
			values[s.Name] = v
		case cuda.ResultOf(err) == cuda.ErrorUnsupportedLimit:
			unsupported = append(unsupported, s.Name)
		default:
			return nil, nil, err
		}
	}
	return values, unsupported, nil
}

// Set validates value, sets the named limit in ctx and reads it back.
//
// When the driver applied something other than value, the result has Clamped set and a Message with both
// numbers; with strict, Set instead restores the previous value and returns an InvalidValue error carrying
// that message. Errors of the driver are explained: CUDA_ERROR_UNSUPPORTED_LIMIT says which limit the device
// lacks, and an INVALID_VALUE for the malloc heap states the rule that fixes the heap once a kernel that
// uses malloc has run.
func Set(drv cuda.Driver, ctx cuda.Context, dev DeviceInfo, name string, value uint64, strict bool) (Applied, error) {
	s, err := Lookup(name)
	if err != nil {
		return Applied{}, err
	}
	if err := s.Check(dev, value); err != nil {
		return Applied{}, err
	}
	prev, err := drv.CtxGetLimit(ctx, s.Limit)
	if err != nil {
		return Applied{}, s.explain(dev, err, value, false)
	}
	a := Applied{Name: s.Name, Unit: s.Unit, Requested: value, Previous: prev}
	if err := drv.CtxSetLimit(ctx, s.Limit, value); err != nil {
		return a, s.explain(dev, err, value, true, prev)
	}
	got, err := drv.CtxGetLimit(ctx, s.Limit)
	if err != nil {
		return a, s.explain(dev, err, value, false)
	}
	a.Applied = got
	if got == value {
		return a, nil
	}
	a.Clamped = true
	a.Message = fmt.Sprintf("the driver clamped %s: asked %s, applied %s", s.Name,
		FormatValue(value, s.Unit), FormatValue(got, s.Unit))
	if !strict {
		return a, nil
	}
	msg := a.Message
	if err := drv.CtxSetLimit(ctx, s.Limit, prev); err == nil {
		msg += fmt.Sprintf("; strict mode: the previous value %s was restored", FormatValue(prev, s.Unit))
	} else {
		msg += fmt.Sprintf("; strict mode: restoring the previous value %s failed (%v), so %s stays in effect",
			FormatValue(prev, s.Unit), err, FormatValue(got, s.Unit))
	}
	return a, cuda.NewError("cudacore.limits.set", cuda.ErrorInvalidValue, msg,
		cuda.Field{Key: "limit", Value: s.Name},
		cuda.Field{Key: "requested", Value: strconv.FormatUint(value, 10)},
		cuda.Field{Key: "applied", Value: strconv.FormatUint(got, 10)})
}

// explain adds what a person needs to a driver error about limit s. set says whether the error came from
// cuCtxSetLimit; prev, for a set, is the value before it.
func (s Spec) explain(dev DeviceInfo, err error, value uint64, set bool, prev ...uint64) error {
	r := cuda.ResultOf(err)
	fields := []cuda.Field{{Key: "limit", Value: s.Name}}
	switch {
	case r == cuda.ErrorUnsupportedLimit:
		return rewrap(err, fields, fmt.Sprintf("device %d (%s) does not support the limit %s (%s)",
			dev.Ordinal, dev.Name, s.Name, s.Doc))
	case set && r == cuda.ErrorInvalidValue && s.Limit == cuda.LimitMallocHeapSize:
		old := "unchanged"
		if len(prev) > 0 {
			old = FormatValue(prev[0], Bytes) + ", unchanged"
		}
		fields = append(fields, cuda.Field{Key: "requested", Value: strconv.FormatUint(value, 10)})
		return rewrap(err, fields, fmt.Sprintf("cannot set malloc_heap_size to %s (it stays %s): the device "+
			"malloc heap is fixed once a kernel that uses device malloc has been launched in this context "+
			"(this process). Set malloc_heap_size at start-up, before the first such kernel, or set it in a "+
			"new process", FormatValue(value, Bytes), old))
	case set:
		fields = append(fields, cuda.Field{Key: "requested", Value: strconv.FormatUint(value, 10)})
		return rewrap(err, fields, fmt.Sprintf("the driver refused %s = %s", s.Name, FormatValue(value, s.Unit)))
	}
	return rewrap(err, fields, "reading "+s.Name)
}

// rewrap returns a new *cuda.Error with err's operation and Result, msg (followed by the driver's own
// message, if it had one) and err's fields after fields. An error that is not a *cuda.Error is kept as the
// cause.
func rewrap(err error, fields []cuda.Field, msg string) error {
	e, ok := err.(*cuda.Error)
	if !ok {
		return &cuda.Error{Op: "cudacore.limits", Result: cuda.ResultOf(err), Msg: msg, Fields: fields, Err: err}
	}
	if e.Msg != "" {
		msg += " (driver: " + e.Msg + ")"
	}
	return &cuda.Error{Op: e.Op, Result: e.Result, Msg: msg, Fields: append(fields, e.Fields...), Err: e.Err}
}

// FormatValue renders a value for a person: "70,368,744,177,664 bytes (64.0 TiB)", "2 levels".
func FormatValue(v uint64, u Unit) string {
	s := Commas(v) + " " + string(u)
	if u == Bytes && v >= 1024 {
		s += " (" + HumanBytes(v) + ")"
	}
	return s
}

// Commas writes v with thousands separators.
func Commas(v uint64) string {
	d := strconv.FormatUint(v, 10)
	var b strings.Builder
	for i, c := range d {
		if i > 0 && (len(d)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// HumanBytes renders v in binary units with one decimal: "16.5 GiB".
func HumanBytes(v uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f := float64(v)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", v)
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
