package module

import (
	"strconv"
	"strings"
)

// Param is one parameter of a PTX kernel entry, as its .param declaration gives it.
type Param struct {
	Name  string `json:"name"`
	Type  string `json:"type"`  // the PTX type without the dot: "u64", "f32", "b8"
	Count int    `json:"count"` // array length, 1 for a scalar
	Align int    `json:"align"` // .align n, or the element size
	Size  int    `json:"size"`  // bytes: element size times Count
	Ptr   bool   `json:"ptr"`   // declared .ptr (a pointer state space attribute)
}

// Class is "int", "float" or "bits": what kind of value the parameter takes.
func (p Param) Class() string {
	switch p.Type[0] {
	case 'f':
		return "float"
	case 'b':
		return "bits"
	}
	return "int"
}

// Decl renders the parameter as it was declared, for messages: ".u64 p", ".b8 s[16]".
func (p Param) Decl() string {
	s := "." + p.Type + " " + p.Name
	if p.Count != 1 {
		s += "[" + strconv.Itoa(p.Count) + "]"
	}
	return s
}

// Entry is one kernel (.entry) of a PTX module and its parameters.
type Entry struct {
	Name   string  `json:"name"`
	Params []Param `json:"params"`
	// Complete says whether every parameter was read. An incomplete list is no signature: a launch is
	// then not checked against it (a correct call must not be told the kernel takes fewer arguments).
	Complete bool `json:"complete"`
}

// ptxTypeSizes are the sizes of the PTX fundamental types a .param may have.
var ptxTypeSizes = map[string]int{
	"u8": 1, "s8": 1, "b8": 1,
	"u16": 2, "s16": 2, "b16": 2, "f16": 2, "bf16": 2,
	"u32": 4, "s32": 4, "b32": 4, "f32": 4,
	"u64": 8, "s64": 8, "b64": 8, "f64": 8,
	"pred": 1,
}

// maxParams bounds what a parse accepts per entry; the driver allows 32,764 bytes of parameters.
const maxParams = 32764

// ParsePTX returns the kernel entries of PTX text in the order they appear. It is lenient: an entry it
// cannot read completely is returned with the parameters it could read and ok false, and text that is not
// PTX gives no entries. It never panics.
func ParsePTX(src string) (entries []Entry, ok bool) {
	toks := tokenize(src)
	ok = true
	for i := 0; i < len(toks); i++ {
		if toks[i] != ".entry" {
			continue
		}
		e, next, good := parseEntry(toks, i+1)
		if e.Name == "" {
			ok = false
			continue
		}
		e.Complete = good
		entries = append(entries, e)
		ok = ok && good
		i = next - 1
	}
	return entries, ok
}

// parseEntry reads "name ( params )" from toks[i:]. It returns the entry, the index after it, and whether
// the parameter list was read completely.
func parseEntry(toks []string, i int) (Entry, int, bool) {
	var e Entry
	if i >= len(toks) || !isIdent(toks[i]) {
		return e, i, false
	}
	e.Name = toks[i]
	i++
	if i >= len(toks) || toks[i] != "(" {
		// A kernel without parameters may omit the list.
		return e, i, true
	}
	i++
	for i < len(toks) && toks[i] != ")" {
		p, next, good := parseParam(toks, i)
		if !good {
			// Skip to the closing parenthesis; the list is not one we understand.
			for i < len(toks) && toks[i] != ")" {
				i++
			}
			return e, i + 1, false
		}
		if len(e.Params) >= maxParams {
			return e, next, false
		}
		e.Params = append(e.Params, p)
		i = next
		if i < len(toks) && toks[i] == "," {
			i++
		}
	}
	if i >= len(toks) {
		return e, i, false
	}
	return e, i + 1, true
}

// parseParam reads ".param [.attrs] .type [.ptr ...] [.align n] name[[n]]" from toks[i:].
func parseParam(toks []string, i int) (Param, int, bool) {
	var p Param
	if i >= len(toks) || toks[i] != ".param" {
		return p, i, false
	}
	i++
	for ; i < len(toks) && strings.HasPrefix(toks[i], "."); i++ {
		t := toks[i][1:]
		switch {
		case t == "align":
			if i+1 >= len(toks) {
				return p, i, false
			}
			n, err := strconv.Atoi(toks[i+1])
			if err != nil || n <= 0 || n > 1<<16 || n&(n-1) != 0 {
				return p, i, false
			}
			p.Align = n
			i++
		case t == "ptr":
			p.Ptr = true
		case t == "global" || t == "const" || t == "local" || t == "shared":
			// state space of a .ptr parameter
		case ptxTypeSizes[t] > 0:
			if p.Type != "" {
				return p, i, false
			}
			p.Type = t
		default:
			return p, i, false
		}
	}
	if p.Type == "" || i >= len(toks) || !isIdent(toks[i]) {
		return p, i, false
	}
	p.Name = toks[i]
	i++
	p.Count = 1
	if i < len(toks) && toks[i] == "[" {
		if i+2 >= len(toks) || toks[i+2] != "]" {
			return p, i, false
		}
		n, err := strconv.Atoi(toks[i+1])
		if err != nil || n <= 0 || n > maxParams {
			return p, i, false
		}
		p.Count = n
		i += 3
	}
	el := ptxTypeSizes[p.Type]
	p.Size = el * p.Count
	if p.Align == 0 {
		p.Align = el
	}
	if p.Size > maxParams {
		return p, i, false
	}
	return p, i, true
}

// tokenize splits PTX into directives (.entry), identifiers, numbers and punctuation, dropping comments
// and strings.
func tokenize(src string) []string {
	var toks []string
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0:
			i++
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				return toks
			}
			i += end + 4
		case c == '"':
			end := strings.IndexByte(src[i+1:], '"')
			if end < 0 {
				return toks
			}
			i += end + 2
		case c == '.' || isIdentByte(c):
			j := i + 1
			for j < len(src) && isIdentByte(src[j]) {
				j++
			}
			toks = append(toks, src[i:j])
			i = j
		default:
			toks = append(toks, src[i:i+1])
			i++
		}
	}
	return toks
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c == '%' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isIdent reports whether t is a PTX identifier (not a directive, number or punctuation).
func isIdent(t string) bool {
	if t == "" || t[0] == '.' || t[0] >= '0' && t[0] <= '9' {
		return false
	}
	for i := 0; i < len(t); i++ {
		if !isIdentByte(t[i]) {
			return false
		}
	}
	return true
}
