package memory

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

func TestRecorderRing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		record   int
		after    uint64
		limit    int
		want     []uint64 // seqs
	}{
		{"empty", 4, 0, 0, 0, nil},
		{"fewer than capacity", 4, 3, 0, 0, []uint64{1, 2, 3}},
		{"wrapped keeps newest", 4, 10, 0, 0, []uint64{7, 8, 9, 10}},
		{"after", 4, 10, 8, 0, []uint64{9, 10}},
		{"after older than the ring", 4, 10, 2, 0, []uint64{7, 8, 9, 10}},
		{"limit", 4, 10, 0, 2, []uint64{9, 10}},
		{"limit above what is kept", 4, 3, 0, 10, []uint64{1, 2, 3}},
		{"after the newest", 4, 3, 3, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRecorder(tc.capacity)
			for i := 0; i < tc.record; i++ {
				r.Record(Event{Kind: EventAlloc, Ptr: cuda.DevicePtr(i + 1), Size: uint64(i)})
			}
			evs, last := r.Since(tc.after, tc.limit)
			assert.Equal(t, uint64(tc.record), last)
			var got []uint64
			for _, e := range evs {
				got = append(got, e.Seq)
				assert.Equal(t, cuda.DevicePtr(e.Seq), e.Ptr, "the event is the one recorded under its seq")
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRecorderLabelResizeDisable(t *testing.T) {
	r := NewRecorder(8)
	r.Record(Event{Kind: EventAlloc, Ptr: 0x100})
	r.Record(Event{Kind: EventFree, Ptr: 0x100})
	seq := r.LastAlloc(0x100)
	require.Equal(t, uint64(1), seq)
	assert.True(t, r.Label(seq, 0x100, "here"))
	assert.False(t, r.Label(seq, 0x200, "wrong pointer"))
	assert.Zero(t, r.LastAlloc(0x300))
	r.Resize(2)
	evs, _ := r.Since(0, 0)
	require.Len(t, evs, 2)
	assert.Equal(t, "here", evs[0].Note)
	assert.True(t, r.SetEnabled(false), "it was on")
	assert.Zero(t, r.Record(Event{Kind: EventAlloc}))
	r.SetEnabled(true)
	assert.Equal(t, uint64(3), r.Record(Event{Kind: EventAlloc}))
	var nilRec *Recorder
	assert.Zero(t, nilRec.Record(Event{}))
	evs, _ = nilRec.Since(0, 0)
	assert.Empty(t, evs)
	assert.Equal(t, "trim", EventTrim.String())
	assert.Equal(t, "unknown", EventKind(99).String())
}

// Notes live beside the ring: an event keeps its own note, and a slot overwritten by an event without
// one does not show the note of the event it replaced.
func TestRecorderNotes(t *testing.T) {
	r := NewRecorder(2)
	r.Record(Event{Kind: EventOOM, Size: 1, Note: CauseLimit})
	r.Record(Event{Kind: EventAlloc, Ptr: 0x100})
	assert.True(t, r.Label(2, 0x100, "labelled"))
	evs, _ := r.Since(0, 0)
	require.Len(t, evs, 2)
	assert.Equal(t, CauseLimit, evs[0].Note)
	assert.Equal(t, "labelled", evs[1].Note)
	r.Record(Event{Kind: EventFree, Ptr: 0x100}) // overwrites the oom event's slot
	r.Resize(4)
	evs, _ = r.Since(0, 0)
	require.Len(t, evs, 2)
	assert.Equal(t, []string{"labelled", ""}, []string{evs[0].Note, evs[1].Note})
	assert.Equal(t, Event{Seq: 3, Time: evs[1].Time, Kind: EventFree, Ptr: 0x100}, evs[1])
	assert.True(t, r.Label(2, 0x100, ""), "a label can be cleared")
	evs, _ = r.Since(1, 1)
	require.Len(t, evs, 1)
	assert.Equal(t, uint64(3), evs[0].Seq)
	evs, _ = r.Since(0, 0)
	assert.Empty(t, evs[0].Note)
}

func TestRecorderConcurrent(t *testing.T) {
	r := NewRecorder(64)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				r.Record(Event{Kind: EventAlloc})
				if i%100 == 0 {
					r.Since(0, 10)
				}
			}
		}()
	}
	wg.Wait()
	evs, last := r.Since(0, 0)
	assert.Equal(t, uint64(8000), last)
	require.Len(t, evs, 64)
	for i := 1; i < len(evs); i++ {
		assert.Equal(t, evs[i-1].Seq+1, evs[i].Seq)
		assert.LessOrEqual(t, evs[i-1].Time, evs[i].Time, "in seq order, times never go back")
	}
}

// The Stack records every kind of event, in order, with the bytes in use after each.
func TestStackRecordsEvents(t *testing.T) {
	_, d := openSim(t, small("sim-1g"))
	rec := NewRecorder(32)
	s := newStack(t, d, StackOptions{Recorder: rec, Limit: 200 * MiB})
	p, err := s.Allocate(100*MiB, 0)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(p, 100*MiB, 0))
	_, err = s.Allocate(300*MiB, 0)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory)
	require.NoError(t, s.Release())
	evs, _ := rec.Since(0, 0)
	var kinds []EventKind
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []EventKind{EventAlloc, EventFree, EventOOM, EventRelease, EventTrim}, kinds)
	assert.Equal(t, 100*MiB, evs[0].InUse)
	assert.Zero(t, evs[1].InUse)
	assert.Equal(t, CauseLimit, evs[2].Note)
	assert.Equal(t, 300*MiB, evs[2].Size)
	assert.Equal(t, 100*MiB, evs[4].Size, "the pool returned the 100 MiB block")
}

// BenchmarkRecorderRecord is the cost of one event through Record: an uncontended lock, a store of one
// cache line, and one read of the runtime's monotonic clock.
func BenchmarkRecorderRecord(b *testing.B) {
	r := NewRecorder(0)
	e := Event{Kind: EventAlloc, Ptr: 0x100, Size: 256}
	for b.Loop() {
		r.Record(e)
	}
}

// Times are the clock's, after a pause as while busy.
func TestRecorderClock(t *testing.T) {
	r := NewRecorder(8)
	r.Record(Event{Kind: EventAlloc})
	time.Sleep(30 * time.Millisecond)
	before := time.Since(r.start)
	r.Record(Event{Kind: EventFree})
	after := time.Since(r.start)
	evs, _ := r.Since(0, 0)
	require.Len(t, evs, 2)
	assert.GreaterOrEqual(t, evs[1].Time-evs[0].Time, 30*time.Millisecond)
	assert.GreaterOrEqual(t, evs[1].Time, before-time.Microsecond)
	assert.LessOrEqual(t, evs[1].Time, after+time.Microsecond)
}

// A burst of events, each well under a microsecond after the last, gets distinct, increasing times within
// the burst's span: fine enough to plot (a millisecond clock put the whole burst at one time).
func TestRecorderBurstTimesAreDistinct(t *testing.T) {
	r := NewRecorder(1024)
	before := time.Since(r.start)
	for i := range 200 {
		r.Record(Event{Kind: EventAlloc, Ptr: cuda.DevicePtr(0x1000 * (i + 1)), Size: 256})
	}
	after := time.Since(r.start)
	evs, _ := r.Since(0, 0)
	require.Len(t, evs, 200)
	for i := 1; i < len(evs); i++ {
		require.Greater(t, evs[i].Time, evs[i-1].Time, "event %d", i)
	}
	// time.Since(r.start) and the recorder's clock read the same monotonic clock from starts a few
	// nanoseconds apart.
	assert.GreaterOrEqual(t, evs[0].Time, before-time.Microsecond)
	assert.LessOrEqual(t, evs[len(evs)-1].Time, after+time.Microsecond)
	assert.Less(t, evs[len(evs)-1].Time-evs[0].Time, 100*time.Millisecond)
}

// While a stream captures, the verdict makes no probe allocation: cuMemAlloc would invalidate the capture.
func TestVerdictProbeSkippedDuringCapture(t *testing.T) {
	drv, d := openSim(t, cudasim.H100())
	require.NoError(t, drv.SetMemoryConditions(0, cudasim.MemoryConditions{PoolReservationLimit: GiB}))
	s := newStack(t, d, StackOptions{})
	_, err := s.Allocate(2*GiB, 0)
	cause, _ := asCUDA(t, err).Field("cause")
	require.Equal(t, CausePoolReservation, cause, "not capturing: the probe tells the pool's refusal apart")

	s.SetCapturing(0x1234, true)
	calls := drv.Calls("cuMemAlloc_v2")
	_, err = s.Allocate(2*GiB, 0)
	cause, _ = asCUDA(t, err).Field("cause")
	assert.Equal(t, CauseFragmentation, cause)
	assert.Equal(t, calls, drv.Calls("cuMemAlloc_v2"), "no probe while capturing")
	s.SetCapturing(0x1234, false)
}

// A free and the allocation of the same block right after it, at the same time, share one slot; readers
// see two events with their own seqs, kinds and bytes in use.
func TestRecorderPairSlots(t *testing.T) {
	r := NewRecorder(4)
	at := time.Now()
	ev := func(free bool, p cuda.DevicePtr) Recycle {
		return Recycle{At: at, Free: free, Ptr: p, Size: 16, Stream: 1}
	}
	r.recordRecycled(0, 100, []Recycle{
		ev(true, 0x10), ev(false, 0x10), // a pair: one slot, seqs 1 and 2
		ev(true, 0x20), ev(false, 0x30), // not the same block: two slots
		ev(false, 0x40),
	})
	assert.Equal(t, uint64(4), r.slots)
	evs, last := r.Since(0, 0)
	require.Equal(t, uint64(5), last)
	require.Len(t, evs, 5)
	kinds := []EventKind{EventFree, EventAlloc, EventFree, EventAlloc, EventAlloc}
	ptrs := []cuda.DevicePtr{0x10, 0x10, 0x20, 0x30, 0x40}
	inUse := []uint64{84, 100, 84, 100, 116}
	for i, e := range evs {
		assert.Equal(t, uint64(i+1), e.Seq)
		assert.Equal(t, kinds[i], e.Kind, "event %d", i)
		assert.Equal(t, ptrs[i], e.Ptr, "event %d", i)
		assert.Equal(t, inUse[i], e.InUse, "event %d", i)
		assert.Equal(t, at.Sub(r.start), e.Time, "event %d keeps its own time", i)
	}

	evs, _ = r.Since(1, 0) // after the pair's free: its allocation only
	require.Len(t, evs, 4)
	assert.Equal(t, uint64(2), evs[0].Seq)
	evs, _ = r.Since(0, 4) // the newest four, starting inside the pair
	require.Len(t, evs, 4)
	assert.Equal(t, uint64(2), evs[0].Seq)
	assert.Equal(t, uint64(2), r.LastAlloc(0x10), "the pair's allocation")
	assert.False(t, r.Label(2, 0x10, "x"), "a pair's allocation takes no label")
	assert.True(t, r.Label(5, 0x40, "x"))
	assert.Zero(t, r.LastAlloc(0x20), "freed, never allocated in the ring")

	// One more slot overwrites the oldest, the pair: both its events go.
	r.Record(Event{Kind: EventFree, Ptr: 0x40})
	evs, _ = r.Since(0, 0)
	require.Len(t, evs, 4)
	assert.Equal(t, uint64(3), evs[0].Seq)
	// Resizing keeps the newest slots, pairs whole.
	r.recordRecycled(0, 116, []Recycle{ev(true, 0x50), ev(false, 0x50)})
	r.Resize(2)
	evs, _ = r.Since(0, 0)
	require.Len(t, evs, 3)
	assert.Equal(t, []uint64{6, 7, 8}, []uint64{evs[0].Seq, evs[1].Seq, evs[2].Seq})
}

// Events recorded late (a batch of what C served) keep the time they happened, but never at or before
// the previous event's (then one nanosecond after it); a free and an allocation at different times take
// a slot each.
func TestRecorderRunTimes(t *testing.T) {
	r := NewRecorder(16)
	r.Record(Event{Kind: EventAlloc, Ptr: 0x10, Size: 16})
	first, _ := r.Since(0, 0)
	past := r.start.Add(first[0].Time - time.Millisecond) // before the first event
	later := r.start.Add(first[0].Time + 500*time.Millisecond)
	r.recordRecycled(0, 16, []Recycle{
		{At: past, Free: true, Ptr: 0x10, Size: 16},
		{At: later, Ptr: 0x10, Size: 16},
	})
	evs, _ := r.Since(1, 0)
	require.Len(t, evs, 2)
	assert.Equal(t, first[0].Time+1, evs[0].Time, "just after the previous event")
	assert.Equal(t, first[0].Time+500*time.Millisecond, evs[1].Time)
	assert.Equal(t, uint64(3), r.slots, "different times: no pair")
}

// Pairs of the same block at the same time share a slot, up to maxPairs of them: a tight loop's
// temporary costs a slot per maxPairs pairs, and readers still see every event with its own seq.
func TestRecorderRepeatedPairs(t *testing.T) {
	r := NewRecorder(8)
	at := time.Now()
	ops := make([]Recycle, 0, 40)
	for range 20 {
		ops = append(ops, Recycle{At: at, Free: true, Ptr: 0x10, Size: 16}, Recycle{At: at, Ptr: 0x10, Size: 16})
	}
	r.recordRecycled(0, 16, ops)
	assert.Equal(t, uint64(3), r.slots, "20 pairs in slots of 8, 8 and 4")
	evs, last := r.Since(0, 0)
	require.Equal(t, uint64(40), last)
	require.Len(t, evs, 40)
	for i, e := range evs {
		assert.Equal(t, uint64(i+1), e.Seq)
		if i%2 == 0 {
			assert.Equal(t, EventFree, e.Kind)
			assert.Zero(t, e.InUse)
		} else {
			assert.Equal(t, EventAlloc, e.Kind)
			assert.Equal(t, uint64(16), e.InUse)
		}
	}
	evs, _ = r.Since(13, 0)
	require.Len(t, evs, 27)
	assert.Equal(t, uint64(14), evs[0].Seq)
	evs, _ = r.Since(0, 5)
	require.Len(t, evs, 5)
	assert.Equal(t, uint64(36), evs[0].Seq)
	assert.Equal(t, uint64(40), r.LastAlloc(0x10))
	assert.False(t, r.Label(40, 0x10, "x"))

	// Another block, or another time, starts a new slot.
	r.recordRecycled(0, 16, []Recycle{{At: at, Free: true, Ptr: 0x20, Size: 16}, {At: at, Ptr: 0x20, Size: 16}})
	later := at.Add(time.Millisecond)
	r.recordRecycled(0, 16, []Recycle{{At: later, Free: true, Ptr: 0x20, Size: 16}, {At: later, Ptr: 0x20, Size: 16}})
	assert.Equal(t, uint64(5), r.slots)
	evs, _ = r.Since(40, 0)
	require.Len(t, evs, 4)
	assert.Equal(t, []cuda.DevicePtr{0x20, 0x20, 0x20, 0x20}, []cuda.DevicePtr{evs[0].Ptr, evs[1].Ptr, evs[2].Ptr, evs[3].Ptr})
}
