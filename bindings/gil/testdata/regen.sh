#!/bin/sh
# Regenerates gopy_v0.4.8_fixture.go.txt: gopy v0.4.8's Go output for ./fixture, unformatted, as gil.Patch
# receives it in the build (the .txt suffix keeps it out of the Go build). Run from the repository root
# after `go run ./bindings/cmd/build` has built build/bin/gopy.
set -eu
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PATH="$PWD/build/bin:$PATH" build/bin/gopy gen -vm="${PYTHON:-python3}" -output="$out" -name=fixture \
	-no-make -dynamic-link=true github.com/cudacore/cudacore/bindings/gil/testdata/fixture >/dev/null
# Drop the lines that name this machine's paths so the fixture is the same wherever it is regenerated.
grep -v -e '^gopy gen ' -e '^#cgo ' "$out/fixture.go" >bindings/gil/testdata/gopy_v0.4.8_fixture.go.txt
