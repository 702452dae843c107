package door_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/bindings/door"
	"github.com/cudacore/cudacore/bindings/gil"
)

const facade = "../../cudacore"

func parseFacade(t *testing.T) []door.Entry {
	t.Helper()
	entries, err := door.Parse(facade)
	require.NoError(t, err, "every exported facade function must be a valid declaration")
	return entries
}

// Every exported facade function is declared (a GIL directive, a door) and guarded: Parse refuses
// anything else, so a successful parse of the real facade with one entry per function is the check.
func TestEveryFacadeFunctionIsADeclaredGuardedEntry(t *testing.T) {
	entries := parseFacade(t)
	funcs, err := gil.Parse(facade)
	require.NoError(t, err)
	assert.Len(t, entries, len(funcs))
}

// The hot paths of the Python package go through generated wrappers; the Buffer glue and the PyTorch
// shim through generated native doors.
func TestHotAndNativePaths(t *testing.T) {
	byName := map[string]door.Entry{}
	for _, e := range parseFacade(t) {
		byName[e.Name] = e
	}
	for name, want := range map[string]door.Door{
		"GraphLaunch": door.Hot, "GraphUpload": door.Hot, "StreamQuery": door.Hot, "StreamWait": door.Hot,
		"StreamSynchronize": door.Hot, "EventQuery": door.Hot, "EventWait": door.Hot, "EventRecord": door.Hot,
		"CopyToDevice": door.Hot, "CopyToDeviceHeld": door.Hot, "CopyToHost": door.Hot, "CopyToHostHeld": door.Hot,
		"CopyDevice": door.Hot, "CopyDeviceHeld": door.Hot, "FunctionLaunch": door.Hot, "Noop": door.Hot,
		"Allocate": door.Native, "Free": door.Native, "PinnedAllocate": door.Native, "PinnedFree": door.Native,
		"DLPackOrder": door.Native, "TorchMalloc": door.Native, "TorchFree": door.Native, "WireMessage": door.Native,
		"DeviceProperties": door.Cold,
	} {
		e, ok := byName[name]
		if assert.True(t, ok, name) {
			assert.Equal(t, want, e.Door, name)
		}
	}
	assert.Equal(t, gil.Device, byName["Allocate"].GIL)
	// Reading into host memory needs a writable view: the door asks for one.
	assert.Equal(t, door.WritableBytes, byName["CopyToHost"].Params[1].Kind)
	assert.Equal(t, door.Bytes, byName["CopyToDevice"].Params[2].Kind)
}

func TestGenerateWrapsEveryHotAndNativeEntry(t *testing.T) {
	entries := parseFacade(t)
	g := door.Generate(entries, "example.com/facade")
	goSrc, h, c := string(g.GoExports), string(g.Header), string(g.Wrappers)
	for _, e := range entries {
		exported := strings.Contains(goSrc, "//export "+e.Export()+"\n")
		prototype := strings.Contains(h, "extern char *"+e.Export()+"(")
		wrapper := strings.Contains(c, "\ndoor_"+e.PyName()+"(PyObject *") &&
			strings.Contains(c, `{"`+e.PyName()+`", `)
		switch e.Door {
		case door.Cold:
			assert.False(t, exported || prototype || wrapper, "%s is cold: gopy's door only", e.Name)
		case door.Native:
			assert.True(t, exported && prototype, "%s: export and prototype", e.Name)
			assert.False(t, wrapper, "%s: native entries have hand-written glue", e.Name)
		case door.Hot:
			assert.True(t, exported && prototype && wrapper, "%s: export, prototype and wrapper", e.Name)
		}
	}
	// Every wrapper passes the guard before Go and raises through the funnel.
	assert.Equal(t, strings.Count(c, "door_enter("), strings.Count(c, "PyDoc_STRVAR("))
	assert.Equal(t, strings.Count(c, "return door_raise(err);"), strings.Count(c, "PyDoc_STRVAR("))
	// Release-mode entries drop the GIL around the call; hold-mode ones do not.
	assert.Contains(t, c, "Py_BEGIN_ALLOW_THREADS\n    err = cudacore_door_StreamWait(")
	assert.Contains(t, c, "    err = cudacore_door_GraphLaunch(a0, a1, a2, &ret);\n    if (err")
}

// The cold door's fast wrappers: one per scalar entry, named like gopy's C function, each through the C
// guard's entry check and converters, calling gopy's export and returning NULL on its RuntimeError; the
// first pass's placeholder is the empty table alone.
func TestGenerateColdWrapsEveryScalarEntry(t *testing.T) {
	entries := parseFacade(t)
	c := string(door.GenerateCold(entries, "core_go.h"))
	assert.True(t, strings.HasPrefix(c, "/* Code generated"), "marked generated")
	assert.Contains(t, c, "#include \"core_go.h\"\n")
	scalar := 0
	for _, e := range entries {
		wrapper := strings.Contains(c, "\ncold_"+e.Name+"(PyObject *") && strings.Contains(c, `{"`+e.GoExport()+`", `)
		assert.Equal(t, e.Scalar(), wrapper, "%s: a cold wrapper exactly when every type is a scalar", e.Name)
		if e.Scalar() {
			scalar++
			assert.Contains(t, c, "ret = "+e.GoExport()+"(", e.Name)
		}
	}
	assert.Greater(t, scalar, len(entries)/2, "most entries are scalar")
	assert.Equal(t, scalar, strings.Count(c, "door_enter("))
	assert.Equal(t, scalar, strings.Count(c, "if (PyErr_Occurred()"))
	// The function as gopy names it, its parameters as Python spells them (an error names them so), and
	// gopy's C types.
	assert.Contains(t, c, `door_int(args[1], "DeviceSynchronize", "timeout_ms", &a1)`)
	assert.Contains(t, c, `door_bool(args[1], "EventCreate", "timing", &a1)`)
	assert.Contains(t, c, "ret = cudacore_EventCreate((long long int)a0, (char)a1);")
	assert.Contains(t, c, "    free(ret);\n    return r;\n") // gopy's strings are malloc'd
	assert.NotContains(t, c, "cold_CopyToDevice(", "a []byte entry keeps gopy's own wrapper")

	placeholder := string(door.GenerateCold(entries, ""))
	assert.NotContains(t, placeholder, "core_go.h")
	assert.NotContains(t, placeholder, "\ncold_")
	assert.Contains(t, placeholder, "PyMethodDef cudacore_cold_methods[] = {\n    {NULL, NULL, 0, NULL},\n};")
}

// The typing stub of cudacore._fast lists every generated wrapper, as generated.
func TestFastStubListsTheGeneratedWrappers(t *testing.T) {
	g := door.Generate(parseFacade(t), "example.com/facade")
	stub, err := os.ReadFile("../../python/cudacore/_fast.pyi")
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(g.Stub)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		assert.Contains(t, string(stub), line+"\n", "python/cudacore/_fast.pyi lacks a generated line")
	}
}

// No C entry point is written by hand in Go: every //export comes from the generator.
func TestNoHandWrittenExports(t *testing.T) {
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "build" || d.Name() == ".git" || d.Name() == ".venv" || d.Name() == "testdata" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			assert.False(t, strings.HasPrefix(sc.Text(), "//export "), "%s:%d: a hand-written cgo export; declare an entry in the facade", path, n)
		}
		return sc.Err()
	})
	require.NoError(t, err)
}

func TestParseRefusesWhatTheDoorsCannotHonour(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"no guard": {`// F does.
//
//cudacore:gil hold
func F(x int) (int, error) { return x, nil }`, "single `return guard(op, ...)`"},
		"unknown door": {`// F does.
//
//cudacore:gil hold
//cudacore:door warm
func F(x int) (int, error) { return guard("f", func() (int, error) { return x, nil }) }`, `unknown door "warm"`},
		"hot with a map": {`// F does.
//
//cudacore:gil hold
//cudacore:door hot
func F(x map[int]int) (int, error) { return guard("f", func() (int, error) { return 0, nil }) }`, "parameters only"},
		"writable int": {`// F does.
//
//cudacore:gil hold
//cudacore:door hot
//cudacore:writable x
func F(x int) (int, error) { return guard("f", func() (int, error) { return x, nil }) }`, "not a []byte"},
		"device without ordinal": {`// F does.
//
//cudacore:gil device
//cudacore:door hot
func F(x int) (int, error) { return guard("f", func() (int, error) { return x, nil }) }`, "ordinal"},
		"no error": {`// F does.
//
//cudacore:gil hold
func F(x int) int { return guard("f", func() (int, error) { return x, nil }) }`, "must return (T, error)"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			src := "package facade\n\nfunc guard[T any](op string, fn func() (T, error)) (T, error) { return fn() }\n\n" + tc.src + "\n"
			require.NoError(t, os.WriteFile(filepath.Join(dir, "f.go"), []byte(src), 0o644))
			_, err := door.Parse(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
