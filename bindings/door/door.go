// Package door reads the facade's declared entry points and generates the hot doors into Go.
//
// Every function that Python or another framework calls in Go is an exported function of the facade
// package (cudacore/) whose doc comment carries its directives:
//
//	//cudacore:gil hold|release   keep the GIL for the call, or release it (see package gil)
//	//cudacore:door cold          gopy's generated module only (the default when the directive is absent)
//	//cudacore:door hot           also a METH_FASTCALL function of cudacore._fast, generated here
//	//cudacore:door native        also a C entry point, generated here, for hand-written C glue
//	                              (cudacore/native: Buffer objects, DLPack, the PyTorch allocator)
//	//cudacore:writable NAME      the []byte parameter NAME is written into: the door asks the exporter
//	                              for a writable view, so read-only memory is refused before Go runs
//
// Its body is a single `return guard(op, ...)`: the one Go guard, which recovers panics and renders
// errors in the wire format. gopy generates the cold door from the same declarations; Generate writes
// the other two:
//
//   - a Go file of cgo exports (package main, compiled into the extension beside gopy's code), one per
//     hot or native entry, named cudacore_door_<Name>: numbers cross as numbers, the result through an
//     out pointer, and the error as a malloc'd wire-format text (NULL on success) that the caller frees;
//   - their C prototypes (door_gen.h);
//   - the METH_FASTCALL wrappers of the hot entries (door_gen.c), which pass the C guard of
//     cudacore/native/door.h: the fork check before Go is entered, argument conversion that names the
//     argument, the GIL policy, and the one error funnel.
//
// Parse refuses a declaration the generator cannot honour (a missing or malformed directive, a body that
// skips the guard, a parameter or result type with no C form), naming the function and its position.
package door

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/token"
	"sort"
	"strings"
	"unicode"

	"github.com/cudacore/cudacore/bindings/gil"
)

// Door is how an entry is reached besides gopy's module.
type Door string

const (
	// Cold entries are reached through gopy's generated module only.
	Cold Door = "cold"
	// Hot entries also get a generated METH_FASTCALL wrapper in cudacore._fast.
	Hot Door = "hot"
	// Native entries also get a generated C entry point for hand-written C.
	Native Door = "native"
)

// Kind is the type of a parameter or result, as far as the doors carry it.
type Kind string

const (
	Int    Kind = "int"
	Bool   Kind = "bool"
	Float  Kind = "float64"
	String Kind = "string"
	// Bytes is a []byte parameter: any C-contiguous buffer-protocol object from Python, passed as its
	// address and length and viewed in place by Go for the duration of the call.
	Bytes Kind = "[]byte"
	// WritableBytes is a []byte parameter named by a //cudacore:writable directive: the same, but the
	// view must be writable.
	WritableBytes Kind = "writable []byte"
)

func (k Kind) isBuffer() bool { return k == Bytes || k == WritableBytes }

// Param is one parameter of an entry.
type Param struct {
	Name string // the Go name, e.g. streamHandle
	Kind Kind
}

// PyName is the parameter's name as Python users see it in error messages (stream_handle).
func (p Param) PyName() string { return snake(p.Name) }

// Entry is one declared entry point.
type Entry struct {
	Name   string // the facade function, e.g. GraphLaunch
	GIL    gil.Mode
	Door   Door
	Params []Param
	Result Kind
	Doc    string // the first sentence of the doc comment
	Pos    token.Position
}

// PyName is the Python name of the entry's fast wrapper (graph_launch).
func (e Entry) PyName() string { return snake(e.Name) }

// Export is the C symbol of the entry's cgo export.
func (e Entry) Export() string { return "cudacore_door_" + e.Name }

const doorDirective = "//cudacore:door"

// Parse reads the facade package in dir and returns every exported function as an Entry, sorted by
// name. All problems are reported together.
func Parse(dir string) ([]Entry, error) {
	funcs, err := gil.Parse(dir)
	if err != nil {
		return nil, err
	}
	var entries []Entry
	var problems []string
	for _, f := range funcs {
		e, err := entryOf(f)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s: %v", f.Pos, f.Name, err))
			continue
		}
		entries = append(entries, e)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("entry declarations in %s:\n  %s", dir, strings.Join(problems, "\n  "))
	}
	return entries, nil
}

func entryOf(f gil.Func) (Entry, error) {
	e := Entry{Name: f.Name, GIL: f.Mode, Door: Cold, Pos: f.Pos, Doc: gil.FirstSentence(f.Decl.Doc.Text())}
	door, err := doorOf(f.Decl)
	if err != nil {
		return e, err
	}
	e.Door = door
	if err := checkGuarded(f.Decl); err != nil {
		return e, err
	}
	res := f.Decl.Type.Results
	if res == nil || len(res.List) != 2 || len(res.List[0].Names) > 1 || typeName(res.List[1].Type) != "error" {
		return e, fmt.Errorf("must return (T, error)")
	}
	e.Result = kindOf(res.List[0].Type)
	writable, err := writableOf(f.Decl)
	if err != nil {
		return e, err
	}
	for _, field := range f.Decl.Type.Params.List {
		k := kindOf(field.Type)
		for _, n := range field.Names {
			if writable[n.Name] {
				if k != Bytes {
					return e, fmt.Errorf("%s is marked writable but is not a []byte", n.Name)
				}
				k = WritableBytes
				delete(writable, n.Name)
			}
			e.Params = append(e.Params, Param{Name: n.Name, Kind: k})
		}
	}
	for name := range writable {
		return e, fmt.Errorf("//cudacore:writable names %s, which is not a parameter", name)
	}
	if e.GIL == gil.Device && (len(e.Params) == 0 || e.Params[0].Name != "ordinal" || e.Params[0].Kind != Int) {
		return e, fmt.Errorf("a %q entry's first parameter must be the device's ordinal (ordinal int)", gil.Device)
	}
	if e.Door == Cold {
		return e, nil // gopy decides what it can bind
	}
	if e.Result == "" || e.Result.isBuffer() {
		return e, fmt.Errorf("a %s entry must return int, bool, float64 or string, not %s", e.Door, typeName(res.List[0].Type))
	}
	for _, p := range e.Params {
		if p.Kind == "" {
			return e, fmt.Errorf("a %s entry takes int, bool, float64, string and []byte parameters only (%s is not)", e.Door, p.Name)
		}
	}
	return e, nil
}

func doorOf(fd *ast.FuncDecl) (Door, error) {
	var doors []Door
	for _, c := range fd.Doc.List {
		if !strings.Contains(c.Text, "cudacore:door") {
			continue
		}
		fields := strings.Fields(c.Text)
		if len(fields) != 2 || fields[0] != doorDirective {
			return "", fmt.Errorf("malformed door directive %q (want %q, %q or %q)", c.Text,
				doorDirective+" cold", doorDirective+" hot", doorDirective+" native")
		}
		switch d := Door(fields[1]); d {
		case Cold, Hot, Native:
			doors = append(doors, d)
		default:
			return "", fmt.Errorf("unknown door %q (want cold, hot or native)", fields[1])
		}
	}
	switch len(doors) {
	case 0:
		return Cold, nil
	case 1:
		return doors[0], nil
	default:
		return "", fmt.Errorf("%d door directives, want at most one", len(doors))
	}
}

const writableDirective = "//cudacore:writable"

// writableOf returns the parameters named by //cudacore:writable directives.
func writableOf(fd *ast.FuncDecl) (map[string]bool, error) {
	names := map[string]bool{}
	for _, c := range fd.Doc.List {
		if !strings.Contains(c.Text, "cudacore:writable") {
			continue
		}
		fields := strings.Fields(c.Text)
		if len(fields) != 2 || fields[0] != writableDirective {
			return nil, fmt.Errorf("malformed directive %q (want %q)", c.Text, writableDirective+" PARAM")
		}
		names[fields[1]] = true
	}
	return names, nil
}

// checkGuarded requires the body to be exactly `return guard(...)`: nothing runs outside the guard.
func checkGuarded(fd *ast.FuncDecl) error {
	if fd.Body == nil || len(fd.Body.List) != 1 {
		return fmt.Errorf("the body must be a single `return guard(op, ...)` statement")
	}
	ret, ok := fd.Body.List[0].(*ast.ReturnStmt)
	if !ok || len(ret.Results) != 1 {
		return fmt.Errorf("the body must be a single `return guard(op, ...)` statement")
	}
	call, ok := ret.Results[0].(*ast.CallExpr)
	if !ok {
		return fmt.Errorf("the body must be a single `return guard(op, ...)` statement")
	}
	fun := call.Fun
	if ix, ok := fun.(*ast.IndexExpr); ok {
		fun = ix.X
	}
	if id, ok := fun.(*ast.Ident); !ok || id.Name != "guard" {
		return fmt.Errorf("the body must be a single `return guard(op, ...)` statement")
	}
	return nil
}

func typeName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	if at, ok := e.(*ast.ArrayType); ok && at.Len == nil {
		if id, ok := at.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return "[]byte"
		}
	}
	return fmt.Sprintf("%T", e)
}

func kindOf(e ast.Expr) Kind {
	switch typeName(e) {
	case "int":
		return Int
	case "bool":
		return Bool
	case "float64":
		return Float
	case "string":
		return String
	case "[]byte":
		return Bytes
	}
	return ""
}

// snake turns a Go identifier into Python's spelling: GraphLaunch -> graph_launch, DLPackOrder ->
// dl_pack_order (a run of capitals is one word). Facade names are chosen to read well this way.
func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			prevLower := i > 0 && (unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]))
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if i > 0 && (prevLower || (nextLower && unicode.IsUpper(rs[i-1]))) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Generated is what Generate writes.
type Generated struct {
	GoExports []byte // package main: the cgo exports
	Header    []byte // door_gen.h: their prototypes
	Wrappers  []byte // door_gen.c: the METH_FASTCALL wrappers of the hot entries
	Stub      []byte // _door.pyi lines for the hot wrappers (typing for cudacore._fast)
}

// Generate writes the doors of the hot and native entries. facadeImport is the facade's import path.
func Generate(entries []Entry, facadeImport string) Generated {
	var g Generated
	var goF, h, c, pyi bytes.Buffer

	fmt.Fprintf(&goF, "// Code generated by bindings/door from the facade's declarations. DO NOT EDIT.\n\n")
	fmt.Fprintf(&goF, "package main\n\n/*\n#include <stdint.h>\n#include <stdlib.h>\n*/\nimport \"C\"\n\n")
	fmt.Fprintf(&goF, "import (\n\t\"unsafe\"\n\n\tfacade %q\n)\n\nvar _ unsafe.Pointer\n\n", facadeImport)

	fmt.Fprintf(&h, "/* Code generated by bindings/door from the facade's declarations. DO NOT EDIT. */\n")
	fmt.Fprintf(&h, "#ifndef CUDACORE_DOOR_GEN_H\n#define CUDACORE_DOOR_GEN_H\n\n#include <stdint.h>\n\n")
	fmt.Fprintf(&h, "/* Each returns NULL on success, or a malloc'd wire-format error text the caller frees. */\n")

	fmt.Fprintf(&c, "/* Code generated by bindings/door from the facade's declarations. DO NOT EDIT. */\n")
	fmt.Fprintf(&c, "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n\n#include \"door.h\"\n#include \"door_gen.h\"\n\n")

	fmt.Fprintf(&pyi, "# Code generated by bindings/door from the facade's declarations. DO NOT EDIT.\n")

	var hot []Entry
	used := false
	for _, e := range entries {
		if e.Door == Cold {
			continue
		}
		used = true
		writeExport(&goF, e)
		fmt.Fprintf(&h, "extern char *%s(%s);\n", e.Export(), cParams(e))
		if e.Door == Hot {
			hot = append(hot, e)
			writeWrapper(&c, e)
			fmt.Fprintf(&pyi, "def %s(%s) -> %s: ...\n", e.PyName(), pyParams(e), pyType(e.Result))
		}
	}
	if !used {
		fmt.Fprintf(&goF, "var _ = facade.Noop\n")
	}
	fmt.Fprintf(&h, "\n#endif\n")
	fmt.Fprintf(&c, "PyMethodDef cudacore_door_methods[] = {\n")
	for _, e := range hot {
		fmt.Fprintf(&c, "    {%q, (PyCFunction)(void (*)(void))door_%s, METH_FASTCALL, door_%s_doc},\n",
			e.PyName(), e.PyName(), e.PyName())
	}
	fmt.Fprintf(&c, "    {NULL, NULL, 0, NULL},\n};\n")
	g.GoExports, g.Header, g.Wrappers, g.Stub = goF.Bytes(), h.Bytes(), c.Bytes(), pyi.Bytes()
	return g
}

func cType(k Kind) string {
	switch k {
	case Int:
		return "int64_t"
	case Bool:
		return "int"
	case Float:
		return "double"
	case String:
		return "const char *"
	case Bytes:
		return "const void *"
	case WritableBytes:
		return "void *"
	}
	panic("door: no C type for kind " + string(k))
}

func cgoType(k Kind) string {
	switch k {
	case Int:
		return "C.int64_t"
	case Bool:
		return "C.int"
	case Float:
		return "C.double"
	case String:
		return "*C.char"
	}
	panic("door: no cgo type for kind " + string(k))
}

func outCType(k Kind) string {
	if k == String {
		return "char **"
	}
	return cType(k) + " *"
}

func cParams(e Entry) string {
	var ps []string
	for _, p := range e.Params {
		ps = append(ps, cType(p.Kind)+" "+p.PyName())
		if p.Kind.isBuffer() {
			ps = append(ps, "int64_t "+p.PyName()+"_len")
		}
	}
	ps = append(ps, outCType(e.Result)+"ret")
	return strings.Join(ps, ", ")
}

func writeExport(w *bytes.Buffer, e Entry) {
	fmt.Fprintf(w, "// %s is the C door of facade.%s: %s\n//\n//export %s\n", e.Export(), e.Name, e.Doc, e.Export())
	var params, args []string
	for i, p := range e.Params {
		n := fmt.Sprintf("a%d", i)
		if p.Kind.isBuffer() {
			// The caller holds the buffer (a Py_buffer view) for the whole call; Go reads it in place.
			params = append(params, n+" unsafe.Pointer", n+"len C.int64_t")
			args = append(args, "unsafe.Slice((*byte)("+n+"), int("+n+"len))")
			continue
		}
		params = append(params, n+" "+cgoType(p.Kind))
		switch p.Kind {
		case Int:
			args = append(args, "int("+n+")")
		case Bool:
			args = append(args, n+" != 0")
		case Float:
			args = append(args, "float64("+n+")")
		case String:
			args = append(args, "C.GoString("+n+")")
		}
	}
	out := "*" + cgoType(e.Result)
	if e.Result == String {
		out = "**C.char"
	}
	params = append(params, "ret "+out)
	fmt.Fprintf(w, "func %s(%s) *C.char {\n", e.Export(), strings.Join(params, ", "))
	fmt.Fprintf(w, "\tv, err := facade.%s(%s)\n", e.Name, strings.Join(args, ", "))
	fmt.Fprintf(w, "\tif err != nil {\n\t\treturn C.CString(err.Error())\n\t}\n")
	switch e.Result {
	case Int:
		fmt.Fprintf(w, "\t*ret = C.int64_t(v)\n")
	case Bool:
		fmt.Fprintf(w, "\t*ret = 0\n\tif v {\n\t\t*ret = 1\n\t}\n")
	case Float:
		fmt.Fprintf(w, "\t*ret = C.double(v)\n")
	case String:
		fmt.Fprintf(w, "\t*ret = C.CString(v)\n")
	}
	fmt.Fprintf(w, "\treturn nil\n}\n\n")
}

func pyType(k Kind) string {
	switch k {
	case Int:
		return "int"
	case Bool:
		return "bool"
	case Float:
		return "float"
	case Bytes, WritableBytes:
		return "_BufferLike" // the stub imports typing_extensions.Buffer as _BufferLike
	}
	return "str"
}

func pyParams(e Entry) string {
	var ps []string
	for _, p := range e.Params {
		ps = append(ps, p.PyName()+": "+pyType(p.Kind))
	}
	if len(ps) > 0 {
		ps = append(ps, "/")
	}
	return strings.Join(ps, ", ")
}

func writeWrapper(w *bytes.Buffer, e Entry) {
	py := e.PyName()
	sig := fmt.Sprintf("%s(%s) -> %s", py, pyParams(e), pyType(e.Result))
	fmt.Fprintf(w, "PyDoc_STRVAR(door_%s_doc, %q);\n\n", py, sig+"\n\n"+e.Doc)
	fmt.Fprintf(w, "static PyObject *\ndoor_%s(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)\n{\n", py)
	for i, p := range e.Params {
		if p.Kind.isBuffer() {
			fmt.Fprintf(w, "    Py_buffer a%d = {0};\n", i)
			continue
		}
		fmt.Fprintf(w, "    %s a%d;\n", strings.TrimSuffix(cType(p.Kind), " "), i)
	}
	switch e.Result {
	case String:
		fmt.Fprintf(w, "    char *ret = NULL;\n")
	default:
		fmt.Fprintf(w, "    %s ret = 0;\n", cType(e.Result))
	}
	fmt.Fprintf(w, "    char *err;\n")
	fmt.Fprintf(w, "    if (door_enter(%q, nargs, %d) < 0) {\n        return NULL;\n    }\n", py, len(e.Params))
	// Buffers are taken last, so that no conversion failure leaves one held.
	for i, p := range e.Params {
		if p.Kind.isBuffer() {
			continue
		}
		fmt.Fprintf(w, "    if (%s(args[%d], %q, %q, &a%d) < 0) {\n        return NULL;\n    }\n", converter(p.Kind), i, py, p.PyName(), i)
	}
	var held []int
	for i, p := range e.Params {
		if !p.Kind.isBuffer() {
			continue
		}
		fmt.Fprintf(w, "    if (door_buffer(args[%d], %q, %q, %d, &a%d) < 0) {\n", i, py, p.PyName(), boolInt(p.Kind == WritableBytes), i)
		for _, j := range held {
			fmt.Fprintf(w, "        PyBuffer_Release(&a%d);\n", j)
		}
		fmt.Fprintf(w, "        return NULL;\n    }\n")
		held = append(held, i)
	}
	var args []string
	for i, p := range e.Params {
		if p.Kind.isBuffer() {
			args = append(args, fmt.Sprintf("a%d.buf, (int64_t)a%d.len", i, i))
			continue
		}
		args = append(args, fmt.Sprintf("a%d", i))
	}
	args = append(args, "&ret")
	call := fmt.Sprintf("err = %s(%s);", e.Export(), strings.Join(args, ", "))
	switch e.GIL {
	case gil.Release:
		fmt.Fprintf(w, "    Py_BEGIN_ALLOW_THREADS\n    %s\n    Py_END_ALLOW_THREADS\n", call)
	case gil.Device:
		fmt.Fprintf(w, "    if (door_blocking(a0)) {\n        Py_BEGIN_ALLOW_THREADS\n        %s\n        Py_END_ALLOW_THREADS\n    } else {\n        %s\n    }\n", call, call)
	default:
		fmt.Fprintf(w, "    %s\n", call)
	}
	for _, j := range held {
		fmt.Fprintf(w, "    PyBuffer_Release(&a%d);\n", j)
	}
	fmt.Fprintf(w, "    if (err != NULL) {\n        return door_raise(err);\n    }\n")
	if e.Result == String {
		fmt.Fprintf(w, "    return door_take_str(ret);\n}\n\n")
		return
	}
	fmt.Fprintf(w, "    return %s;\n}\n\n", pyScalar(e.Result, "ret"))
}

// converter is the C guard's converter (door.h) of a scalar parameter of kind k.
func converter(k Kind) string {
	return map[Kind]string{Int: "door_int", Bool: "door_bool", Float: "door_float", String: "door_str"}[k]
}

// pyScalar is the C expression that makes the Python object of v, a C int, bool or float of kind k.
func pyScalar(k Kind, v string) string {
	switch k {
	case Int:
		return "PyLong_FromLongLong((long long)" + v + ")"
	case Bool:
		return "PyBool_FromLong(" + v + ")"
	case Float:
		return "PyFloat_FromDouble(" + v + ")"
	}
	panic("door: no Python scalar for kind " + string(k))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---- the cold door's fast wrappers ----------------------------------------------------------------------

// Scalar says whether every parameter and the result of e are of a kind that gopy exports as a C scalar
// or string (int, bool, float64, string): its cold call can then skip pybindgen's argument parsing and
// call gopy's export directly (GenerateCold).
func (e Entry) Scalar() bool {
	scalar := func(k Kind) bool { return k == Int || k == Bool || k == Float || k == String }
	if !scalar(e.Result) {
		return false
	}
	for _, p := range e.Params {
		if !scalar(p.Kind) {
			return false
		}
	}
	return true
}

// GoExport is the C symbol of gopy's cgo export of the entry (its cold door): cudacore_<Name>.
func (e Entry) GoExport() string { return "cudacore_" + e.Name }

// GenerateCold writes cold_gen.c: for every scalar entry (Entry.Scalar), a METH_FASTCALL function named
// like gopy's C function (cudacore_<Name>) that converts its arguments with the C guard's converters
// (door.h, naming the function, and the argument as Python spells it) and calls gopy's cgo export, which
// keeps gopy's GIL handling (as patched by package gil) and its error path: a Go error becomes a
// RuntimeError carrying the wire text, which the wrapper turns into the typed exception through the one
// funnel (door_translate), so the Python layer calls these functions directly. What it replaces is
// pybindgen's wrapper of the same export: an argument tuple, PyArg_ParseTupleAndKeywords and
// Py_BuildValue on every call.
//
// The file includes gopy's export header (exportHeader, core_go.h), which cgo writes in the build's first
// pass, so the C compiler checks every call against gopy's own prototypes. That first pass compiles the
// placeholder GenerateCold(nil, ""): the table alone, empty. The table is cudacore_cold_methods.
func GenerateCold(entries []Entry, exportHeader string) []byte {
	var c bytes.Buffer
	fmt.Fprintf(&c, "/* Code generated by bindings/door from the facade's declarations. DO NOT EDIT. */\n")
	if exportHeader == "" {
		entries = nil
		fmt.Fprintf(&c, "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n\n")
	} else {
		fmt.Fprintf(&c, "#define PY_SSIZE_T_CLEAN\n#include %q\n\n#include <stdlib.h>\n\n#include \"door.h\"\n\n", exportHeader)
	}
	var scalar []Entry
	for _, e := range entries {
		if e.Scalar() {
			scalar = append(scalar, e)
			writeColdWrapper(&c, e)
		}
	}
	fmt.Fprintf(&c, "PyMethodDef cudacore_cold_methods[] = {\n")
	for _, e := range scalar {
		fmt.Fprintf(&c, "    {%q, (PyCFunction)(void (*)(void))cold_%s, METH_FASTCALL, cold_%s_doc},\n", e.GoExport(), e.Name, e.Name)
	}
	fmt.Fprintf(&c, "    {NULL, NULL, 0, NULL},\n};\n")
	return c.Bytes()
}

// gopyCType is the C type gopy's export uses for a kind.
func gopyCType(k Kind) string {
	switch k {
	case Int:
		return "long long int"
	case Bool:
		return "char"
	case Float:
		return "double"
	case String:
		return "char *"
	}
	panic("door: gopy exports no C scalar for kind " + string(k))
}

func writeColdWrapper(w *bytes.Buffer, e Entry) {
	var sig []string
	for _, p := range e.Params {
		sig = append(sig, p.Name+": "+pyType(p.Kind))
	}
	fmt.Fprintf(w, "PyDoc_STRVAR(cold_%s_doc, %q);\n\n", e.Name,
		fmt.Sprintf("%s(%s) -> %s\n\n%s", e.GoExport(), strings.Join(sig, ", "), pyType(e.Result), e.Doc))
	fmt.Fprintf(w, "static PyObject *\ncold_%s(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)\n{\n", e.Name)
	for i, p := range e.Params {
		fmt.Fprintf(w, "    %s a%d;\n", strings.TrimSuffix(cType(p.Kind), " "), i)
	}
	fmt.Fprintf(w, "    if (door_enter(%q, nargs, %d) < 0) {\n        return NULL;\n    }\n", e.Name, len(e.Params))
	var args []string
	for i, p := range e.Params {
		fmt.Fprintf(w, "    if (%s(args[%d], %q, %q, &a%d) < 0) {\n        return NULL;\n    }\n", converter(p.Kind), i, e.Name, p.PyName(), i)
		args = append(args, fmt.Sprintf("(%s)a%d", gopyCType(p.Kind), i))
	}
	fmt.Fprintf(w, "    %sret = %s(%s);\n", withSpace(gopyCType(e.Result)), e.GoExport(), strings.Join(args, ", "))
	if e.Result == String {
		// gopy returns a malloc'd string, an empty one with the error.
		fmt.Fprintf(w, "    if (PyErr_Occurred() || ret == NULL) {\n        free(ret);\n        return PyErr_Occurred() ? door_translate() : PyErr_NoMemory();\n    }\n")
		fmt.Fprintf(w, "    PyObject *r = PyUnicode_FromString(ret);\n    free(ret);\n    return r;\n}\n\n")
		return
	}
	fmt.Fprintf(w, "    if (PyErr_Occurred()) {\n        return door_translate();\n    }\n    return %s;\n}\n\n", pyScalar(e.Result, "ret"))
}

// withSpace ends a C type with the space or star that separates it from a name.
func withSpace(t string) string {
	if strings.HasSuffix(t, "*") {
		return t
	}
	return t + " "
}
