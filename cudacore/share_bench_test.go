package cudacore

import (
	"runtime"
	"testing"
	"time"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// BenchmarkShareImportClose opens and closes 64 MiB of "ipc" memory that another process exported (the
// test binary itself, exporterMain): "driver" by the driver's calls alone (cuIpcOpenMemHandle_v2 and
// cuIpcCloseMemHandle through the process's driver), "facade" through the doors' Go entries (ShareImport,
// OwnedFree), the Go half of IpcHandle.open and ImportedBuffer.close without the crossing from Python.
// The difference between the two is what Go's bookkeeping costs. open-ns/op and close-ns/op time the two
// halves apart. On a GPU:
//
//	go test -c -o dist/cudacore.test ./cudacore                                                  # here
//	CUDACORE_BACKEND=cuda ./dist/cudacore.test -test.run '^$' -test.bench ShareImportClose -test.benchtime 200x  # there
func BenchmarkShareImportClose(b *testing.B) {
	const size = 64 << 20
	e := startExporter(b, size)
	h, err := parseHandle("bench", e.Handle)
	if err != nil {
		b.Fatal(err)
	}
	d, err := process.GetDevice(0)
	if err != nil {
		b.Fatal(err)
	}
	drv, ctx := d.Driver(), d.Context()
	// A Python caller makes both calls on its own thread, where the context stays current.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var (
		p     cuda.DevicePtr // the driver's mapping
		token uint64         = 1 << 41
	)
	for _, c := range []struct {
		name        string
		open, close func() error
	}{
		{"driver", func() error {
			var err error
			p, err = drv.IpcOpenMemHandle(ctx, h)
			return err
		}, func() error {
			return drv.IpcCloseMemHandle(ctx, p)
		}},
		{"facade", func() error {
			token++
			_, err := ShareImport(0, e.Kind, e.Handle, e.FD, e.PoolID, size, int(token))
			return err
		}, func() error {
			_, err := OwnedFree(int(token))
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var opening, closing time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := c.open(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := c.close(); err != nil {
					b.Fatal(err)
				}
				opening += t1.Sub(t0)
				closing += time.Since(t1)
			}
			b.ReportMetric(float64(opening.Nanoseconds())/float64(b.N), "open-ns/op")
			b.ReportMetric(float64(closing.Nanoseconds())/float64(b.N), "close-ns/op")
		})
	}
}
