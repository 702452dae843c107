package main

// The package gopy generates imports gopyh (its handle table). Nothing else in this module does, and
// `go mod vendor` copies only imported packages, so this import keeps gopyh in vendor/ and the offline
// build (GOFLAGS=-mod=vendor, GOPROXY=off) complete.
import _ "github.com/go-python/gopy/gopyh"
