module github.com/cudacore/cudacore

go 1.26.0

require github.com/stretchr/testify v1.12.1 // indirect
