module github.com/cudacore/cudacore

go 1.26.0
