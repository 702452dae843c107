package cuda

import (
	"errors"
	"strconv"
	"strings"
)

// The wire format is how an error crosses from Go into Python. gopy turns every Go error into
// RuntimeError(err.Error()) and nothing more, so the facade renders errors with Encode and the Python
// layer parses the text back (python/cudacore/_errors.py) into a typed exception. Both sides test the
// same examples; change them together.
//
//	cuda[<code> <NAME> <op>]{<key>=<value> ...}: <message>
//
// The {...} block is optional. code is a decimal Result, NAME its name, op has no spaces; keys are
// [a-z0-9_]+ and values hold no space, '{', '}' or '='. The message is everything after ": ", newlines
// included.
const wirePrefix = "cuda["

// WireError is a decoded wire-format error.
type WireError struct {
	Result  Result
	Name    string
	Op      string
	Fields  []Field
	Message string
}

// Encode renders err in the wire format. The header comes from the first *Error in err's chain; an error
// without one is reported as CUDACORE_ERROR_INTERNAL, since every expected failure carries a Result.
// Encode(nil) is "".
func Encode(err error) string {
	if err == nil {
		return ""
	}
	r, op := ErrorInternal, "cudacore"
	var fields []Field
	var e *Error
	if errors.As(err, &e) {
		r, op, fields = e.Result, e.Op, e.Fields
	}
	var b strings.Builder
	b.WriteString(wirePrefix)
	b.WriteString(strconv.Itoa(int(r)))
	b.WriteByte(' ')
	b.WriteString(r.String())
	b.WriteByte(' ')
	b.WriteString(wireToken(op, "cudacore"))
	b.WriteByte(']')
	if len(fields) > 0 {
		b.WriteByte('{')
		n := 0
		for _, f := range fields {
			k := wireKey(f.Key)
			if k == "" {
				continue
			}
			if n > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(k)
			b.WriteByte('=')
			b.WriteString(wireToken(f.Value, "-"))
			n++
		}
		b.WriteByte('}')
	}
	b.WriteString(": ")
	b.WriteString(err.Error())
	return b.String()
}

// Decode parses a wire-format string. ok is false when s is not in the format; Decode never panics.
func Decode(s string) (w WireError, ok bool) {
	rest, found := strings.CutPrefix(s, wirePrefix)
	if !found {
		return w, false
	}
	head, rest, found := strings.Cut(rest, "]")
	if !found {
		return w, false
	}
	parts := strings.Split(head, " ")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return w, false
	}
	code, err := strconv.ParseInt(parts[0], 10, 32)
	if err != nil {
		return w, false
	}
	w.Result, w.Name, w.Op = Result(code), parts[1], parts[2]
	if strings.HasPrefix(rest, "{") {
		body, after, found := strings.Cut(rest[1:], "}")
		if !found {
			return WireError{}, false
		}
		if body != "" {
			for _, kv := range strings.Split(body, " ") {
				k, v, found := strings.Cut(kv, "=")
				if !found || k == "" || wireKey(k) != k {
					return WireError{}, false
				}
				w.Fields = append(w.Fields, Field{k, v})
			}
		}
		rest = after
	}
	msg, found := strings.CutPrefix(rest, ": ")
	if !found {
		return WireError{}, false
	}
	w.Message = msg
	return w, true
}

// wireToken makes s safe for a header slot: no spaces, brackets, braces or '='; empty becomes def.
func wireToken(s, def string) string {
	s = strings.Map(func(c rune) rune {
		switch c {
		case ' ', '\t', '\n', '\r', '[', ']', '{', '}', '=':
			return '_'
		}
		return c
	}, s)
	if s == "" {
		return def
	}
	return s
}

// wireKey lower-cases a field key and keeps only [a-z0-9_] of it.
func wireKey(k string) string {
	return strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' {
			return c
		}
		return -1
	}, strings.ToLower(k))
}
