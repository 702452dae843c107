// Package gil decides, per facade function, whether the gopy wrapper keeps or releases the GIL, and
// applies that decision to gopy's generated Go code.
//
// gopy v0.4.8 releases the GIL around every call (PyEval_SaveThread / PyEval_RestoreThread). That doubles
// the cost of a short call and makes threads convoy on the GIL (docs/contributing/design.md, "The GIL"). Each exported facade
// function therefore carries a directive in its doc comment:
//
//	//cudacore:gil hold      keep the GIL: short calls that cannot block
//	//cudacore:gil release   release the GIL: calls that can wait
//
// Parse reads the directives from the facade's source; Patch removes the release/retake pair from the
// wrappers of "hold" functions. Patch checks the exact shape gopy generates and fails loudly on anything
// else, so a gopy upgrade that changes its output cannot silently turn the policy off.
package gil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Mode is what a wrapper does with the GIL during the call.
type Mode string

const (
	// Hold keeps the GIL for the whole call.
	Hold Mode = "hold"
	// Release releases the GIL while Go runs (gopy's default).
	Release Mode = "release"
	// Device holds the GIL unless the device named by the entry's first parameter (ordinal) has an
	// allocator that can block (the synchronous strategy), whose calls release it. gopy's wrappers, which
	// cannot ask, release it.
	Device Mode = "device"
)

// directive is the comment prefix of a GIL directive. Like //go: directives it has no space after "//",
// which also keeps it out of the godoc text.
const directive = "//cudacore:gil"

// Func is one exported facade function and its directive.
type Func struct {
	Name string
	Mode Mode
	Pos  token.Position // of the func keyword, for error messages
	Decl *ast.FuncDecl  // for further checks (gil_test.go checks the result types)
	Fset *token.FileSet
}

// Parse reads the Go package in dir (non-test files that match the current build context) and returns its
// exported package-level functions with their GIL directive, sorted by name. A function with no directive,
// more than one, or a malformed one is an error naming the function and its file:line; all such problems
// are reported together.
func Parse(dir string) ([]Func, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var funcs []Func
	var problems []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		// gopy binds what `go build` compiles, so honour build constraints the same way.
		if ok, err := build.Default.MatchFile(dir, name); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			// Methods are bound by gopy as methods of classes; the facade's rule covers functions.
			if !ok || fd.Recv != nil || !fd.Name.IsExported() {
				continue
			}
			pos := fset.Position(fd.Pos())
			mode, err := directiveOf(fd)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %s: %v", pos, fd.Name.Name, err))
				continue
			}
			funcs = append(funcs, Func{Name: fd.Name.Name, Mode: mode, Pos: pos, Decl: fd, Fset: fset})
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("GIL directives in %s:\n  %s", dir, strings.Join(problems, "\n  "))
	}
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].Name < funcs[j].Name })
	return funcs, nil
}

// directiveOf returns the mode named by fd's one directive. A comment line that mentions cudacore:gil but
// is not exactly a directive (a space after //, an unknown mode, extra words) is malformed rather than
// ignored: a typo must not quietly fall back to gopy's default.
func directiveOf(fd *ast.FuncDecl) (Mode, error) {
	if fd.Doc == nil {
		return "", fmt.Errorf("no doc comment, so no %s directive (want %q or %q)",
			directive, directive+" hold", directive+" release")
	}
	var modes []Mode
	for _, c := range fd.Doc.List {
		if !strings.Contains(c.Text, "cudacore:gil") {
			continue
		}
		fields := strings.Fields(c.Text)
		if len(fields) != 2 || fields[0] != directive ||
			(fields[1] != string(Hold) && fields[1] != string(Release) && fields[1] != string(Device)) {
			return "", fmt.Errorf("malformed GIL directive %q (want %q, %q or %q)",
				c.Text, directive+" hold", directive+" release", directive+" device")
		}
		modes = append(modes, Mode(fields[1]))
	}
	switch len(modes) {
	case 0:
		return "", fmt.Errorf("missing %s directive (want %q or %q)", directive, directive+" hold", directive+" release")
	case 1:
		return modes[0], nil
	default:
		return "", fmt.Errorf("%d %s directives, want exactly one", len(modes), directive)
	}
}

// Policy maps function name to mode.
func Policy(funcs []Func) map[string]Mode {
	p := make(map[string]Mode, len(funcs))
	for _, f := range funcs {
		p[f.Name] = f.Mode
	}
	return p
}

// Manifest is the JSON the build writes next to the generated module (sorted keys, trailing newline), so
// that the Python tests know which calls must keep the GIL and which must let other threads run.
func Manifest(policy map[string]Mode) ([]byte, error) {
	b, err := json.MarshalIndent(policy, "", "  ") // encoding/json sorts map keys
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// The statements gopy v0.4.8 (bind/gen_func.go, genFuncBody) writes around the call.
const (
	saveStmt     = "_saved_thread := C.PyEval_SaveThread()"
	restoreStmt  = "C.PyEval_RestoreThread(_saved_thread)"
	restoreDefer = "defer C.PyEval_RestoreThread(_saved_thread)"
)

// Patch returns src, gopy's generated Go file, with the GIL release/retake removed from the wrapper of
// every function whose policy is Hold. The wrapper of facade function F is the function named P_F whose
// body calls P.F(...) (gopy names it after the Go package P). Every function in policy must have exactly
// one wrapper of the expected shape: one `_saved_thread := C.PyEval_SaveThread()` and one restore, plain
// or deferred, each alone on its line at the top level of the body, and no other use of _saved_thread.
// Anything else is an error. Lines outside the hold wrappers are left byte for byte as they were.
func Patch(src []byte, policy map[string]Mode) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "generated.go", src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse generated Go: %w", err)
	}
	wrappers := map[string][]*ast.FuncDecl{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil || fd.Body == nil {
			continue
		}
		if name, ok := wrappedFunc(fd); ok {
			wrappers[name] = append(wrappers[name], fd)
		}
	}

	names := make([]string, 0, len(policy))
	for name := range policy {
		names = append(names, name)
	}
	sort.Strings(names)

	lines := bytes.SplitAfter(src, []byte("\n"))
	drop := map[int]bool{} // 0-based line indexes
	var problems []string
	for _, name := range names {
		mode := policy[name]
		if mode != Hold && mode != Release && mode != Device {
			problems = append(problems, fmt.Sprintf("%s: unknown mode %q", name, mode))
			continue
		}
		ws := wrappers[name]
		if len(ws) != 1 {
			problems = append(problems, fmt.Sprintf("%s: found %d gopy wrappers calling it, want 1", name, len(ws)))
			continue
		}
		stmtLines, err := gilLines(fset, lines, ws[0])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: wrapper %s: %v", name, ws[0].Name.Name, err))
			continue
		}
		if mode == Hold {
			for _, l := range stmtLines {
				drop[l] = true
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("gil.Patch: generated code does not have the shape gopy v0.4.8 produces:\n  %s",
			strings.Join(problems, "\n  "))
	}

	var out bytes.Buffer
	out.Grow(len(src))
	for i, l := range lines {
		if !drop[i] {
			out.Write(l)
		}
	}
	return out.Bytes(), nil
}

// wrappedFunc reports the facade function that a gopy wrapper calls: the wrapper named P_F calling P.F.
func wrappedFunc(fd *ast.FuncDecl) (string, bool) {
	var found string
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found != "" {
			return found == ""
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if ok && fd.Name.Name == pkg.Name+"_"+sel.Sel.Name {
			found = sel.Sel.Name
		}
		return true
	})
	return found, found != ""
}

// gilLines checks the wrapper's shape and returns the 0-based line indexes of its save and restore
// statements.
func gilLines(fset *token.FileSet, lines [][]byte, fd *ast.FuncDecl) ([]int, error) {
	var save, restore []int
	for _, st := range fd.Body.List {
		text, line, err := soleLine(fset, lines, st)
		switch text {
		case saveStmt:
			save = append(save, line)
		case restoreStmt, restoreDefer:
			restore = append(restore, line)
		default:
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	if len(save) != 1 || len(restore) != 1 {
		return nil, fmt.Errorf("want one %q and one restore (%q or %q) at the top level, found %d and %d",
			saveStmt, restoreStmt, restoreDefer, len(save), len(restore))
	}
	if restore[0] < save[0] {
		return nil, fmt.Errorf("restore before save")
	}
	// Any other mention of _saved_thread (nested, passed on) means code we do not understand.
	uses := 0
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == "_saved_thread" {
			uses++
		}
		return true
	})
	if uses != 2 {
		return nil, fmt.Errorf("_saved_thread is used %d times, want 2 (save and restore)", uses)
	}
	return []int{save[0], restore[0]}, nil
}

// soleLine returns the statement's source text, whitespace-normalised, and its line index; err is set when
// the statement does not stand alone on one line (then removing the line would remove other code).
func soleLine(fset *token.FileSet, lines [][]byte, st ast.Stmt) (string, int, error) {
	start, end := fset.Position(st.Pos()), fset.Position(st.End())
	if start.Line != end.Line {
		return "", 0, nil // multi-line statements are never the ones we look for
	}
	i := start.Line - 1
	stmt := string(lines[i][start.Column-1 : end.Column-1])
	text := strings.Join(strings.Fields(stmt), " ")
	if strings.TrimSpace(string(lines[i])) != stmt {
		return text, i, fmt.Errorf("line %d holds more than the statement %q", start.Line, text)
	}
	return text, i, nil
}
