package gen

import (
	"bytes"
	"fmt"
)

// The DLPack ABI that cudacore speaks: the producer in C (Buffer.__dlpack__, cudacore/native/buffer.c)
// and the consumer in Python (ctypes, python/cudacore/_external.py) read these definitions, rendered from
// here, so the two cannot disagree on a field. The layout is DLPack's (dlpack.h, versions 0.8 and 1.x);
// only the parts cudacore uses are named.

// dlConst is a DLPack constant, named as dlpack.h names it.
type dlConst struct {
	name  string
	value uint64
	doc   string
}

var dlConsts = []dlConst{
	{"kDLCPU", 1, "Host memory"},
	{"kDLCUDA", 2, "CUDA device memory"},
	{"kDLCUDAHost", 3, "Page-locked host memory"},
	{"kDLCUDAManaged", 13, "CUDA managed memory"},
	{"kDLUInt", 1, "The DLDataType.code of an unsigned integer"},
	{"DLPACK_FLAG_BITMASK_READ_ONLY", 1 << 0, "The DLManagedTensorVersioned.flags bit that forbids the consumer to write the tensor"},
}

// dlField is one member of a struct. Its kind is a fixed-size integer ("int32", "uint8", ...), "ptr"
// (void *), "int64ptr" (int64_t *), "deleter" (a function taking the enclosing struct's address) or the
// name of another struct of dlStructs, held by value.
type dlField struct{ name, kind string }

type dlStruct struct {
	name   string
	fields []dlField
}

var dlStructs = []dlStruct{
	{"DLDevice", []dlField{{"device_type", "int32"}, {"device_id", "int32"}}},
	{"DLDataType", []dlField{{"code", "uint8"}, {"bits", "uint8"}, {"lanes", "uint16"}}},
	{"DLTensor", []dlField{
		{"data", "ptr"}, {"device", "DLDevice"}, {"ndim", "int32"}, {"dtype", "DLDataType"},
		{"shape", "int64ptr"}, {"strides", "int64ptr"}, {"byte_offset", "uint64"},
	}},
	{"DLManagedTensor", []dlField{{"dl_tensor", "DLTensor"}, {"manager_ctx", "ptr"}, {"deleter", "deleter"}}},
	{"DLPackVersion", []dlField{{"major", "uint32"}, {"minor", "uint32"}}},
	{"DLManagedTensorVersioned", []dlField{
		{"version", "DLPackVersion"}, {"manager_ctx", "ptr"}, {"deleter", "deleter"}, {"flags", "uint64"},
		{"dl_tensor", "DLTensor"},
	}},
}

var dlIntKinds = map[string]struct{ c, ctypes string }{
	"int32":  {"int32_t", "ctypes.c_int32"},
	"uint8":  {"uint8_t", "ctypes.c_uint8"},
	"uint16": {"uint16_t", "ctypes.c_uint16"},
	"uint32": {"uint32_t", "ctypes.c_uint32"},
	"uint64": {"uint64_t", "ctypes.c_uint64"},
}

// dlRender renders field f of struct owner as a C member declaration and as a ctypes type (the deleter is
// a plain address to ctypes: the consumer calls it through a CFUNCTYPE it makes).
func dlRender(f dlField, owner string) (c, ctype string) {
	switch f.kind {
	case "ptr":
		return "void *" + f.name, "ctypes.c_void_p"
	case "int64ptr":
		return "int64_t *" + f.name, "ctypes.POINTER(ctypes.c_int64)"
	case "deleter":
		return fmt.Sprintf("void (*%s)(struct %s *self)", f.name, owner), "ctypes.c_void_p"
	}
	if k, ok := dlIntKinds[f.kind]; ok {
		return k.c + " " + f.name, k.ctypes
	}
	return f.kind + " " + f.name, f.kind // another struct, held by value
}

// dlC renders the constants and structs as C.
func dlC(b *bytes.Buffer) {
	b.WriteString("/* The DLPack ABI (cudacore/internal/tablegen/gen/dlpack.go). */\n")
	for _, c := range dlConsts {
		fmt.Fprintf(b, "#define %s %d /* %s */\n", c.name, c.value, c.doc)
	}
	for _, s := range dlStructs {
		fmt.Fprintf(b, "\ntypedef struct %s {\n", s.name)
		for _, f := range s.fields {
			decl, _ := dlRender(f, s.name)
			fmt.Fprintf(b, "    %s;\n", decl)
		}
		fmt.Fprintf(b, "} %s;\n", s.name)
	}
}

// dlPython renders the constants and structs as ctypes.
func dlPython(b *bytes.Buffer) {
	b.WriteString("# The DLPack ABI (cudacore/internal/tablegen/gen/dlpack.go).\n")
	for _, c := range dlConsts {
		fmt.Fprintf(b, "#: %s.\n%s = %d\n", c.doc, c.name, c.value)
	}
	for _, s := range dlStructs {
		fmt.Fprintf(b, "\n\nclass %s(ctypes.Structure):\n    _fields_ = [\n", s.name)
		for _, f := range s.fields {
			_, t := dlRender(f, s.name)
			fmt.Fprintf(b, "        (%q, %s),\n", f.name, t)
		}
		b.WriteString("    ]\n")
	}
}
