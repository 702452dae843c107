package cudacore

import "time"

// Noop does nothing and returns x. It measures the cost of a crossing from Python with the GIL held and
// is what the GIL-policy tests call.
//
//cudacore:gil hold
//cudacore:door hot
func Noop(x int) (int, error) {
	return guard("cudacore.noop", func() (int, error) { return x, nil })
}

// NoopReleased does nothing but sleep for ms milliseconds with the GIL released, and returns ms. It
// measures the cost of a GIL-releasing crossing and lets tests prove that a releasing call lets other
// Python threads run.
//
//cudacore:gil release
func NoopReleased(ms int) (int, error) {
	return guard("cudacore.noop_released", func() (int, error) {
		if ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		return ms, nil
	})
}
