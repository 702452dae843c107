package module

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// ArgKind is the type of one kernel argument as the caller gave it.
type ArgKind string

const (
	Int8    ArgKind = "i8"
	Uint8   ArgKind = "u8"
	Int16   ArgKind = "i16"
	Uint16  ArgKind = "u16"
	Int32   ArgKind = "i32"
	Uint32  ArgKind = "u32"
	Int64   ArgKind = "i64"
	Uint64  ArgKind = "u64"
	Float16 ArgKind = "f16"
	Float32 ArgKind = "f32"
	Float64 ArgKind = "f64"
	Pointer ArgKind = "ptr" // a device pointer, 8 bytes
	Raw     ArgKind = "raw" // bytes passed as they are (a struct by value)
)

var kindSizes = map[ArgKind]int{
	Int8: 1, Uint8: 1, Int16: 2, Uint16: 2, Int32: 4, Uint32: 4, Int64: 8, Uint64: 8,
	Float16: 2, Float32: 4, Float64: 8, Pointer: 8,
}

// Arg is one kernel argument: its kind and its bytes, little-endian, as the kernel receives them.
type Arg struct {
	Kind  ArgKind
	Bytes []byte
}

// Pointers returns the values of the arguments that may be device pointers: every argument of kind
// Pointer, and every 8-byte integer (a kernel's pointer parameter may be passed as one).
func Pointers(args []Arg) []cuda.DevicePtr {
	var out []cuda.DevicePtr
	for _, a := range args {
		if len(a.Bytes) == 8 && (a.Kind == Pointer || a.Kind == Int64 || a.Kind == Uint64) {
			out = append(out, cuda.DevicePtr(binary.LittleEndian.Uint64(a.Bytes)))
		}
	}
	return out
}

// class is "int", "float" or "bits" (raw bytes), matching Param.Class.
func (a Arg) class() string {
	switch a.Kind {
	case Float16, Float32, Float64:
		return "float"
	case Raw:
		return "bits"
	}
	return "int"
}

func (a Arg) String() string {
	if a.Kind == Raw {
		return fmt.Sprintf("raw (%d bytes)", len(a.Bytes))
	}
	return fmt.Sprintf("%s (%d bytes)", a.Kind, len(a.Bytes))
}

// Constructors for the common kinds.
func I32(v int32) Arg  { return Arg{Int32, binary.LittleEndian.AppendUint32(nil, uint32(v))} }
func U32(v uint32) Arg { return Arg{Uint32, binary.LittleEndian.AppendUint32(nil, v)} }
func I64(v int64) Arg  { return Arg{Int64, binary.LittleEndian.AppendUint64(nil, uint64(v))} }
func U64(v uint64) Arg { return Arg{Uint64, binary.LittleEndian.AppendUint64(nil, v)} }
func F32(v float32) Arg {
	return Arg{Float32, binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))}
}
func F64(v float64) Arg {
	return Arg{Float64, binary.LittleEndian.AppendUint64(nil, math.Float64bits(v))}
}
func Ptr(p cuda.DevicePtr) Arg {
	return Arg{Pointer, binary.LittleEndian.AppendUint64(nil, uint64(p))}
}

// ArgCodes numbers the kinds in the packed form (PackArgs, UnpackArgs): the code of a kind is its index.
// Append only: the Python layer writes these numbers.
var ArgCodes = []ArgKind{"", Int8, Uint8, Int16, Uint16, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Pointer, Raw}

// PackArgs renders args in the packed form UnpackArgs reads: per argument one byte of kind code, the
// length as two bytes little-endian, then the argument's bytes.
func PackArgs(args []Arg) []byte {
	var b []byte
	for _, a := range args {
		code := 0
		for i, k := range ArgCodes {
			if k == a.Kind {
				code = i
			}
		}
		b = append(b, byte(code), byte(len(a.Bytes)), byte(len(a.Bytes)>>8))
		b = append(b, a.Bytes...)
	}
	return b
}

// UnpackArgs decodes the packed form the facade receives from Python. The argument bytes are views into
// b, which must stay unchanged until the launch has been queued. Malformed input is an InvalidValue
// error naming the argument; UnpackArgs never panics.
func UnpackArgs(b []byte) ([]Arg, error) {
	var args []Arg
	for i := 0; len(b) > 0; i++ {
		if len(b) < 3 {
			return nil, argError(fmt.Sprintf("argument %d: truncated header (%d bytes left)", i, len(b)))
		}
		code, n := int(b[0]), int(b[1])|int(b[2])<<8
		b = b[3:]
		if code == 0 || code >= len(ArgCodes) {
			return nil, argError(fmt.Sprintf("argument %d: unknown kind code %d", i, code))
		}
		if n > len(b) {
			return nil, argError(fmt.Sprintf("argument %d: %d bytes announced, %d left", i, n, len(b)))
		}
		kind := ArgCodes[code]
		if size, known := kindSizes[kind]; known && n != size {
			return nil, argError(fmt.Sprintf("argument %d: a %s holds %d bytes, got %d", i, kind, size, n))
		}
		if kind == Raw && (n == 0 || n > maxParams) {
			return nil, argError(fmt.Sprintf("argument %d: raw arguments must hold 1 to %d bytes, got %d", i, maxParams, n))
		}
		args = append(args, Arg{kind, b[:n:n]})
		b = b[n:]
	}
	return args, nil
}

func argError(msg string) error {
	return cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue, msg)
}

// CheckArgs matches args against a kernel's PTX parameters: the count, then each argument's size and
// kind (a float for a .f parameter, an integer or pointer for .u/.s, anything of the right size for .b).
// The error names the first parameter that does not match.
func CheckArgs(kernel string, params []Param, args []Arg) error {
	// The signature is rendered only for an error: this check runs on every launch.
	if len(args) != len(params) {
		sig := Signature(kernel, params)
		return cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue,
			fmt.Sprintf("kernel %s takes %d argument%s, got %d; its signature is %s",
				kernel, len(params), plural(len(params)), len(args), sig),
			cuda.Field{Key: "expected", Value: strconv.Itoa(len(params))},
			cuda.Field{Key: "given", Value: strconv.Itoa(len(args))})
	}
	for i, p := range params {
		a := args[i]
		bad := ""
		switch {
		case len(a.Bytes) != p.Size:
			bad = fmt.Sprintf("it takes %d bytes", p.Size)
		case p.Class() == "float" && a.class() != "float":
			bad = "it takes a floating-point value"
		case p.Class() == "int" && a.class() == "float":
			bad = "it takes an integer (or a device pointer)"
		}
		if bad != "" {
			sig := Signature(kernel, params)
			return cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue,
				fmt.Sprintf("kernel %s, argument %d (parameter %s): got %s, but %s; the signature is %s",
					kernel, i, p.Decl(), a, bad, sig),
				cuda.Field{Key: "param", Value: p.Name}, cuda.Field{Key: "index", Value: strconv.Itoa(i)})
		}
	}
	return nil
}

// Signature renders "fill(.u64 p, .u32 v, .u64 n)".
func Signature(kernel string, params []Param) string {
	parts := make([]string, len(params))
	for i, p := range params {
		parts[i] = p.Decl()
	}
	return kernel + "(" + strings.Join(parts, ", ") + ")"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
