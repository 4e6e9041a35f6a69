package benchutil

import "runtime"

// LiveHeap is the heap still in use after collecting garbage: what a process holds,
// without what it has dropped and not yet reclaimed. Collected twice, since objects
// with finalizers are freed only by the collection after the one that finds them.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
