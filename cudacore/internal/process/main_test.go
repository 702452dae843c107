package process

import (
	"fmt"
	"os"
	"testing"
)

// simDevicesForTests is the simulator every test of the package runs on: three devices, 0 and 1 peers, 2 in
// a peer group of its own. The backend is chosen once per process, by the first call that opens it, so it is
// chosen here, before any test runs; a test that opened it first would fix its shape for all the others,
// and the tests that need several devices (multi_test.go) would meet one.
const simDevicesForTests = `[{}, {}, {"peer_group": 1}]`

func TestMain(m *testing.M) {
	os.Exit(func() int {
		for k, v := range map[string]string{"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": simDevicesForTests} {
			if err := os.Setenv(k, v); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
		if n, err := DeviceCount(); err != nil || n != 3 {
			fmt.Fprintf(os.Stderr, "the simulator for the tests did not open with 3 devices: %d, %v\n", n, err)
			return 2
		}
		return m.Run()
	}())
}
