// Command resultgen turns results.tsv, the one table of CUresult values, into results_gen.go (Go) and
// python/cudacore/_results.py (the same table for the Python exception mapping). It runs from go generate
// in pkg/cuda; results_test.go checks that both committed outputs are current.
package main

import (
	"fmt"
	"os"

	"github.com/cudacore/cudacore/pkg/cuda/internal/resultgen/gen"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: resultgen results.tsv results_gen.go _results.py")
		os.Exit(2)
	}
	in, err := os.ReadFile(os.Args[1])
	if err == nil {
		var goSrc, pySrc []byte
		goSrc, pySrc, err = gen.Generate(in)
		if err == nil {
			err = os.WriteFile(os.Args[2], goSrc, 0o644)
		}
		if err == nil {
			err = os.WriteFile(os.Args[3], pySrc, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "resultgen:", err)
		os.Exit(1)
	}
}
