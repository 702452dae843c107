package stream

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFill sets bytes synchronously and on a stream, at an offset into an allocation.
func TestFill(t *testing.T) {
	e := newEnv(t)
	p := e.alloc(t, 64)
	require.NoError(t, e.m.Fill(p, 0x11, 64, nil))
	s, err := e.m.Create(true, 0)
	require.NoError(t, err)
	require.NoError(t, e.m.Fill(p+8, 0x22, 8, s))
	require.NoError(t, s.Synchronize())
	got := make([]byte, 64)
	require.NoError(t, e.m.CopyDtoH(got, p, nil))
	want := append(append(bytes.Repeat([]byte{0x11}, 8), bytes.Repeat([]byte{0x22}, 8)...), bytes.Repeat([]byte{0x11}, 48)...)
	require.Equal(t, want, got)
	require.NoError(t, e.m.Fill(p, 0, 0, nil), "an empty fill does nothing")
}
