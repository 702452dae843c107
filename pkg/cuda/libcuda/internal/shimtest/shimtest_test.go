package shimtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A thread that used the per-thread default stream synchronizes it, once per context, when it exits.
func TestAThreadDrainsItsPerThreadStreamsWhenItExits(t *testing.T) {
	cases := []struct {
		name                string
		contexts, repeats   int
		wantDrains, refused int
	}{
		{"no use", 0, 0, 0, 0},
		{"one context", 1, 1, 1, 0},
		{"one context, used often", 1, 50, 1, 0},
		{"three contexts", 3, 4, 3, 0},
		{"more contexts than a thread keeps", 20, 1, 16, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			drains, refused := RunThread(c.contexts, c.repeats)
			assert.Equal(t, c.wantDrains, drains, "drains at exit")
			assert.Equal(t, c.refused, refused, "refused requests")
		})
	}
	assert.Zero(t, OtherSyncs(), "the drain synchronizes the per-thread stream only")
}
