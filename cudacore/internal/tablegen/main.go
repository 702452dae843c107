// Command tablegen writes the tables that Go owns and the other languages read (package gen):
// python/cudacore/_tables.py and cudacore/native/tables_gen.h. It runs from go generate in this
// directory; gen's test checks that both committed files are current.
package main

import (
	"fmt"
	"os"

	"github.com/cudacore/cudacore/cudacore/internal/tablegen/gen"
)

//go:generate go run . ../../../python/cudacore/_tables.py ../../native/tables_gen.h

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: tablegen _tables.py tables_gen.h")
		os.Exit(2)
	}
	err := os.WriteFile(os.Args[1], gen.Python(), 0o644)
	if err == nil {
		err = os.WriteFile(os.Args[2], gen.C(), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tablegen:", err)
		os.Exit(1)
	}
}
