// Command build produces cudacore's CPython extension for one Python interpreter.
//
// It does what `gopy build -vm=PY -dynamic-link=true` does, step by step, with cudacore's additions:
//
//  1. build the pinned gopy and goimports (go.mod's tool directives) into build/bin;
//  2. `gopy gen` the bindings of the facade package into a work directory;
//  3. patch the generated Go file according to the facade's //cudacore:gil directives (bindings/gil) and
//     write the policy manifest _gil_policy.json;
//  4. goimports, then one c-shared build only to get the cgo export header that pybindgen's C includes;
//  5. run gopy's build.py with the target Python (pybindgen writes the C module);
//  6. generate the hot and native doors from the facade's declarations (bindings/door: cgo exports,
//     their C prototypes, the METH_FASTCALL wrappers) and relink the final extension with that Python's
//     include flags and without libpython, with cudacore/native (the C guard, the module _fast and the
//     PyTorch allocator shim) compiled into the same shared library, so that the process has one Go
//     runtime;
//  7. copy the extension and the generated Python files into -out (a Python package directory).
//
// Usage (from the repository root):
//
//	go run ./bindings/cmd/build -python /path/to/python [-out python/cudacore/_gopy]
//
// Cross builds: the extension is built for the platform the Python reports (sysconfig.get_platform()),
// which is the machine's own unless _PYTHON_HOST_PLATFORM names another, as it does for setuptools.
// For linux-aarch64 on an x86-64 machine (make wheels WHEEL_ARCH=aarch64), the cgo builds get GOARCH=arm64
// and the extension is named with that platform's EXT_SUFFIX (.cpython-312-aarch64-linux-gnu.so); the
// interpreter given still supplies the headers and the version, and CC and CXX must be a C toolchain for
// the target (scripts/wheels.sh passes zig's). The tools run here (gopy, goimports) are built for this
// machine whatever GOARCH says.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/cudacore/cudacore/bindings/door"
	"github.com/cudacore/cudacore/bindings/gil"
)

const (
	facadePkg = "github.com/cudacore/cudacore/cudacore"
	facadeDir = "cudacore"
	// nativeDir holds the hand-written C and C++ of the doors; it is compiled only here, with the
	// generated main package (it needs Python.h), never by go build ./...
	nativeDir = "cudacore/native"
	// cSharedHeaders declare what Go packages define in C and cudacore/native uses: the recycle log
	// (cudacore/internal/recycle) and the snapshot of the facts the fast path decides on
	// (cudacore/internal/snapshot). They are copied beside the native sources.
	cSharedHeaders = "cudacore/internal/recycle/recycle.h cudacore/internal/snapshot/snapshot.h"
	// name is gopy's -name: it names the Go file (core.go), the header (core_go.h) and the extension
	// (_core<EXT_SUFFIX>). It must not start with "_": gopy's go.py calls the extension as `_<name>` from
	// inside class bodies, and Python mangles `__core` there into `_ClassName__core`. The module is private
	// because the package it goes into, cudacore._gopy, is.
	name = "core"
	// pybindgenVersion is installed into a build-local directory when the target Python lacks pybindgen.
	pybindgenVersion = "0.22.1"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("bindings/build: ")
	python := flag.String("python", "python3", "the Python interpreter to build for")
	out := flag.String("out", "python/cudacore/_gopy", "directory that receives the extension and the generated Python files")
	work := flag.String("work", "", "work directory (default build/_gopy_<python tag>)")
	flag.Parse()
	if err := run(*python, *out, *work); err != nil {
		log.Fatal(err)
	}
}

func run(python, out, work string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if python, err = exec.LookPath(python); err != nil {
		return fmt.Errorf("python interpreter: %w", err)
	}
	if python, err = filepath.Abs(python); err != nil {
		return err
	}
	py, err := pythonConfig(python)
	if err != nil {
		return err
	}
	log.Printf("target %s (%s, %s, GOARCH=%s)", python, py.Tag, py.ExtSuffix, py.GoArch)

	if work == "" {
		// A leading "_" keeps the generated main package out of `go build/vet/test ./...`.
		work = filepath.Join("build", "_gopy_"+py.Tag)
		if py.GoArch != runtime.GOARCH {
			work += "_" + py.GoArch
		}
	}
	work, err = filepath.Abs(work)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}

	// 1. Tools, built from the versions go.mod pins (`go install pkg@version` needs the version list,
	// which the module proxy here refuses).
	bin, err := filepath.Abs(filepath.Join("build", "bin"))
	if err != nil {
		return err
	}
	// The tools run on this machine: built without the target's GOARCH or cgo (both are pure Go).
	hostEnv := append(os.Environ(), "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH, "CGO_ENABLED=0")
	for _, tool := range []string{"github.com/go-python/gopy", "golang.org/x/tools/cmd/goimports"} {
		if err := cmd("", hostEnv, "go", "build", "-o", bin+string(os.PathSeparator), tool); err != nil {
			return err
		}
	}
	// gopy runs `go` and (in build mode) goimports from PATH; put ours first. Every go command from here
	// on builds for the target.
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "GOARCH="+py.GoArch)

	pyEnv, err := ensurePybindgen(python, root, py.Tag, env)
	if err != nil {
		return err
	}

	// gopy gen builds the facade first but carries on when that fails, and then fails later with a less
	// helpful message; stop here instead.
	if err := cmd("", env, "go", "build", facadePkg); err != nil {
		return err
	}

	// 2. Generate. -no-make: we drive the build; -dynamic-link: do not link libpython (the interpreter
	// provides its symbols; a wheel built here must load into another machine's Python of that version).
	if err := cmd("", env, filepath.Join(bin, "gopy"), "gen", "-vm="+python, "-output="+work, "-name="+name,
		"-no-make", "-dynamic-link=true", facadePkg); err != nil {
		return err
	}

	// 3. GIL policy.
	funcs, err := gil.Parse(facadeDir)
	if err != nil {
		return err
	}
	policy := gil.Policy(funcs)
	goFile := filepath.Join(work, name+".go")
	src, err := os.ReadFile(goFile)
	if err != nil {
		return err
	}
	patched, err := gil.Patch(src, policy)
	if err != nil {
		return err
	}
	if err := os.WriteFile(goFile, cgoWithoutRunpath(patched), 0o644); err != nil {
		return err
	}
	manifest, err := gil.Manifest(policy)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "_gil_policy.json"), manifest, 0o644); err != nil {
		return err
	}
	stub, err := gil.Stub("cudacore._gopy.cudacore", funcs)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "cudacore.pyi"), stub, 0o644); err != nil {
		return err
	}
	for _, f := range funcs {
		log.Printf("gil: %-24s %s", f.Name, f.Mode)
	}

	// The doors: generated Go exports and C wrappers, and the hand-written C of cudacore/native, all in
	// the generated main package, so that cgo compiles them into the same library.
	decls, err := door.Parse(facadeDir)
	if err != nil {
		return err
	}
	gen := door.Generate(decls, facadePkg)
	for name, b := range map[string][]byte{"door_exports.go": gen.GoExports, "door_gen.h": gen.Header,
		"door_gen.c": gen.Wrappers, "_door.pyi": gen.Stub} {
		if err := os.WriteFile(filepath.Join(work, name), b, 0o644); err != nil {
			return err
		}
	}
	native, err := os.ReadDir(nativeDir)
	if err != nil {
		return err
	}
	for _, e := range native {
		if !e.IsDir() {
			if err := copyFile(filepath.Join(nativeDir, e.Name()), filepath.Join(work, e.Name())); err != nil {
				return err
			}
		}
	}
	for _, h := range strings.Fields(cSharedHeaders) {
		if err := copyFile(h, filepath.Join(work, filepath.Base(h))); err != nil {
			return err
		}
	}
	coldFile := filepath.Join(work, "cold_gen.c")
	if err := os.WriteFile(coldFile, door.GenerateCold(nil, ""), 0o644); err != nil { // the first pass's placeholder
		return err
	}

	// 4. goimports (gopy's output has unused and missing imports), then a first c-shared build whose only
	// purpose is the export header core_go.h that the pybindgen C code includes.
	if err := cmd(work, env, filepath.Join(bin, "goimports"), "-w", name+".go"); err != nil {
		return err
	}
	header := name + "_go"
	if err := cmd(work, env, "go", "build", "-buildmode=c-shared", "-o", header+".so", "."); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(work, header+".so")); err != nil {
		return err
	}
	// The cold door's fast wrappers call gopy's exports, declared by the header that pass wrote.
	if err := os.WriteFile(coldFile, door.GenerateCold(decls, header+".h"), 0o644); err != nil {
		return err
	}

	// 5. pybindgen writes core.c (the PyInit__core module and its method table).
	if err := cmd(work, pyEnv, python, "build.py"); err != nil {
		return err
	}

	// 6. The extension. CGO_CFLAGS/CGO_LDFLAGS as gopy computes them for -dynamic-link, with one change:
	// gopy adds -Ofast, whose -ffast-math may also switch the process's FPU into flush-to-zero when the
	// library loads; nothing here needs it, so -O2.
	ext := "_" + name + py.ExtSuffix
	// Flags already in CGO_CFLAGS and CGO_LDFLAGS come last, so that a cross toolchain (make wheels: zig
	// cc for an old glibc, docs/contributing/building.md) can add its own. No -g: -ldflags=-s strips the symbol table
	// and -w the DWARF, so the shipped library carries no debug information; -trimpath keeps the build
	// machine's paths out of it.
	buildEnv := append(env[:len(env):len(env)],
		"CGO_ENABLED=1",
		"CGO_CFLAGS="+strings.Join(append([]string{"-I" + py.IncDir, "-fPIC", "-O2"}, strings.Fields(os.Getenv("CGO_CFLAGS"))...), " "),
		"CGO_LDFLAGS="+strings.Join(append(py.LdDynamicFlags, strings.Fields(os.Getenv("CGO_LDFLAGS"))...), " "))
	if err := cmd(work, buildEnv, "go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", ext, "."); err != nil {
		return err
	}

	// 7. Install into the package directory. Generated Python: gopy's package files (__init__.py, go.py and
	// cudacore.py, named after the Go package).
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(work)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if n == ext || n == "_gil_policy.json" || n == "cudacore.pyi" || n == "_door.pyi" || (strings.HasSuffix(n, ".py") && n != "build.py") {
			if err := copyFile(filepath.Join(work, n), filepath.Join(out, n)); err != nil {
				return err
			}
		}
	}
	log.Printf("installed %s and the generated Python files into %s", ext, out)
	return nil
}

// pyConfig is what the build needs to know about the target Python; pythonConfig follows gopy's
// bind.GetPythonConfig for the dynamic-link case.
type pyConfig struct {
	Tag            string   // cp311, cp312, ...
	ExtSuffix      string   // .cpython-311-x86_64-linux-gnu.so (the target's: see targetPlatform)
	IncDir         string   // Python.h lives here
	LdDynamicFlags []string // LDSHARED without the compiler: link flags for a module that relies on the interpreter's symbols
	GoArch         string   // the target's GOARCH
}

const pyConfigScript = `
import json, sys, sysconfig
ldshared = sysconfig.get_config_var("LDSHARED") or ""
print(json.dumps({
    "tag": "cp%d%d" % sys.version_info[:2],
    "extsuffix": sysconfig.get_config_var("EXT_SUFFIX"),
    # The interpreter's own platform (its build's MULTIARCH triplet) and the one to build for, which
    # _PYTHON_HOST_PLATFORM overrides (sysconfig.get_platform honours it, as setuptools' wheel tag does).
    "multiarch": sysconfig.get_config_var("MULTIARCH") or "",
    "platform": sysconfig.get_platform(),
    "incdir": sysconfig.get_path("include"),
    # LDSHARED is "<compiler> -shared ..."; cgo brings its own compiler. "-bundle" is macOS-only and cgo
    # already passes the equivalent (gopy's clear_ld_flags does the same).
    "ldflags": ldshared.split(" ", 1)[1].replace("-bundle", "") if " " in ldshared else "",
}))
`

func pythonConfig(python string) (pyConfig, error) {
	var stdout bytes.Buffer
	c := exec.Command(python, "-c", pyConfigScript)
	c.Stdout, c.Stderr = &stdout, os.Stderr
	if err := c.Run(); err != nil {
		return pyConfig{}, fmt.Errorf("%s: reading sysconfig: %w", python, err)
	}
	var raw struct {
		Tag, ExtSuffix, Multiarch, Platform, IncDir, LdFlags string
	}
	if err := json.Unmarshal(stdout.Bytes(), &raw); err != nil {
		return pyConfig{}, fmt.Errorf("%s: decoding sysconfig: %w", python, err)
	}
	if raw.ExtSuffix == "" || raw.IncDir == "" {
		return pyConfig{}, fmt.Errorf("%s: sysconfig has no EXT_SUFFIX or include path", python)
	}
	if _, err := os.Stat(filepath.Join(raw.IncDir, "Python.h")); err != nil {
		return pyConfig{}, fmt.Errorf("%s: no Python.h in %s (install the Python development headers)", python, raw.IncDir)
	}
	goarch, suffix, err := targetPlatform(raw.Platform, raw.Multiarch, raw.ExtSuffix)
	if err != nil {
		return pyConfig{}, fmt.Errorf("%s: %w", python, err)
	}
	return pyConfig{Tag: raw.Tag, ExtSuffix: suffix, IncDir: raw.IncDir,
		LdDynamicFlags: withoutRunpath(strings.Fields(raw.LdFlags)), GoArch: goarch}, nil
}

// cgoWithoutRunpath drops the run-time search paths from the #cgo LDFLAGS lines of gopy's generated Go
// file, which copies them from the interpreter's LDSHARED (see withoutRunpath).
func cgoWithoutRunpath(src []byte) []byte {
	const directive = "#cgo LDFLAGS:"
	lines := strings.Split(string(src), "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(l, directive); ok {
			lines[i] = strings.TrimRight(directive+" "+strings.Join(withoutRunpath(strings.Fields(rest)), " "), " ")
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// withoutRunpath drops the run-time search paths from LDSHARED's flags (pyenv's and other builds with a
// shared libpython add -Wl,-rpath,<prefix>/lib): the extension links no libpython, so they would only
// carry the build machine's folders into every wheel as a RUNPATH.
func withoutRunpath(flags []string) []string {
	var out []string
	for _, f := range flags {
		if !strings.HasPrefix(f, "-Wl,-rpath,") && !strings.HasPrefix(f, "-Wl,-rpath=") && !strings.HasPrefix(f, "-Wl,-R") {
			out = append(out, f)
		}
	}
	return out
}

// linuxTargets maps the Linux platforms cudacore is built for (sysconfig.get_platform() spelling) to
// their GOARCH and to the multiarch triplet in CPython's EXT_SUFFIX there.
var linuxTargets = map[string]struct{ goarch, multiarch string }{
	"linux-x86_64":  {"amd64", "x86_64-linux-gnu"},
	"linux-aarch64": {"arm64", "aarch64-linux-gnu"},
}

// targetPlatform returns the GOARCH and the extension suffix for building on an interpreter whose
// EXT_SUFFIX and MULTIARCH are its own, for platform (sysconfig.get_platform(), which names another
// machine when _PYTHON_HOST_PLATFORM is set). For the interpreter's own platform the suffix is its
// EXT_SUFFIX unchanged; for another, the interpreter's triplet in it is replaced by the target's
// (.cpython-312-x86_64-linux-gnu.so becomes .cpython-312-aarch64-linux-gnu.so), which is the name the
// target's CPython of that version imports.
func targetPlatform(platform, multiarch, extSuffix string) (goarch, suffix string, err error) {
	t, ok := linuxTargets[platform]
	if !ok {
		known := make([]string, 0, len(linuxTargets))
		for p := range linuxTargets {
			known = append(known, p)
		}
		slices.Sort(known)
		return "", "", fmt.Errorf("cannot build for platform %q: cudacore builds for %s", platform, strings.Join(known, ", "))
	}
	if multiarch == t.multiarch {
		return t.goarch, extSuffix, nil
	}
	own := "-" + multiarch + ".so"
	if multiarch == "" || !strings.HasSuffix(extSuffix, own) {
		return "", "", fmt.Errorf("cannot cross-build for %s: EXT_SUFFIX %q does not end in the interpreter's triplet %q",
			platform, extSuffix, multiarch)
	}
	return t.goarch, strings.TrimSuffix(extSuffix, own) + "-" + t.multiarch + ".so", nil
}

// ensurePybindgen returns the environment for running gopy's build.py. If the target Python cannot import
// pybindgen (under pip, the build requirements provide it), it is installed into build/pydeps/<tag> and
// put on PYTHONPATH, leaving the interpreter's own site-packages alone.
func ensurePybindgen(python, root, tag string, env []string) ([]string, error) {
	if exec.Command(python, "-c", "import pybindgen").Run() == nil {
		return env, nil
	}
	deps := filepath.Join(root, "build", "pydeps", tag)
	pyEnv := append(env[:len(env):len(env)], "PYTHONPATH="+deps+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"))
	c := exec.Command(python, "-c", "import pybindgen")
	c.Env = pyEnv
	if c.Run() == nil {
		return pyEnv, nil
	}
	log.Printf("pybindgen missing for %s: installing it into %s", python, deps)
	if err := cmd("", env, python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
		"--target", deps, "pybindgen=="+pybindgenVersion); err != nil {
		return nil, err
	}
	return pyEnv, nil
}

// cmd runs a command in dir (the current directory when empty), echoing it and its output.
func cmd(dir string, env []string, name string, args ...string) error {
	log.Printf("$ %s %s", name, strings.Join(args, " "))
	c := exec.Command(name, args...)
	c.Dir, c.Stdout, c.Stderr = dir, os.Stderr, os.Stderr
	if env != nil {
		c.Env = env
	}
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	// Write to a temporary name and rename: a Python process may have the old extension mapped.
	tmp := dst + ".tmp"
	o, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	if err := o.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// repoRoot is the directory of go.mod: the build runs there so that the facade package, the tools and the
// generated package all resolve in the one module.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the cudacore module (run from the repository)")
	}
	return filepath.Dir(mod), nil
}
