package snapshot

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDeviceFactsRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   DeviceFacts
		want DeviceFacts
	}{
		{"the real driver", DeviceFacts{Direct: DirectCUDA, Blocking: true, Context: 7, Table: 9, PageableMax: 1 << 20},
			DeviceFacts{Direct: DirectCUDA, Blocking: true, Context: 7, Table: 9, PageableMax: 1 << 20}},
		{"the real driver without its table is off", DeviceFacts{Direct: DirectCUDA, Context: 7, PageableMax: -1},
			DeviceFacts{Direct: DirectOff, Context: 7, PageableMax: -1}},
		{"the real driver without a context is off", DeviceFacts{Direct: DirectCUDA, Table: 9},
			DeviceFacts{Direct: DirectOff, Table: 9}},
		{"the simulator needs no table", DeviceFacts{Direct: DirectSim, Context: 3},
			DeviceFacts{Direct: DirectSim, Context: 3}},
		{"off", DeviceFacts{Direct: DirectOff, Blocking: true}, DeviceFacts{Direct: DirectOff, Blocking: true}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			SetDevice(i, c.in)
			assert.Equal(t, c.want, Device(i))
		})
	}
	SetBlocking(0, false)
	assert.False(t, Device(0).Blocking)
	assert.Equal(t, DirectCUDA, Device(0).Direct, "a strategy change leaves the rest alone")
}

func TestOrdinalsBeyondTheTableAreIgnored(t *testing.T) {
	for _, o := range []int{-1, Devices, Devices + 5} {
		SetDevice(o, DeviceFacts{Direct: DirectSim, Context: 1})
		SetBlocking(o, true)
		assert.Equal(t, DeviceFacts{}, Device(o), o)
	}
}

func TestCounts(t *testing.T) {
	for _, n := range []int32{3, 0} {
		SetCaptures(n)
		assert.Equal(t, n, Captures())
		SetGraphMemoryPending(int(n) * 2)
		assert.Equal(t, int(n)*2, GraphMemoryPending())
	}
}
