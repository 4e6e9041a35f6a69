package service

import (
	"context"
	"sync"
	"time"

	"github.com/flytekube/backend/cacheservice/store"
)

// Hits collects when entries are found, so that the store learns which are in use with
// one write per flush rather than one per hit. It holds at most Max keys between
// flushes: past that, hits of further keys are not kept (an entry hit once in a flush
// interval and then dropped only looks a little less used), so a burst of distinct
// hits cannot grow the service's memory.
type Hits struct {
	Max int
	now func() time.Time

	mu      sync.Mutex
	pending map[store.Key]time.Time
	dropped int
}

// NewHits collects up to max keys between flushes.
func NewHits(max int) *Hits {
	return &Hits{Max: max, now: time.Now, pending: make(map[store.Key]time.Time)}
}

// Hit notes that k was found now; a nil Hits notes nothing.
func (h *Hits) Hit(k store.Key) {
	if h == nil {
		return
	}
	at := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.pending[k]; !ok && len(h.pending) >= h.Max {
		h.dropped++
		return
	}
	h.pending[k] = at
}

// flushChunk bounds the keys written by one statement.
const flushChunk = 1000

// Flush writes the hits noted since the last flush and reports how many it wrote and
// how many it could not keep. Hits it fails to write are put back, unless newer ones of
// the same keys came meanwhile or there is no room.
func (h *Hits) Flush(ctx context.Context, st *store.Store) (written, dropped int, err error) {
	h.mu.Lock()
	pending, dropped := h.pending, h.dropped
	h.pending, h.dropped = make(map[store.Key]time.Time, len(pending)), 0
	h.mu.Unlock()

	batch := make([]store.Hit, 0, min(len(pending), flushChunk))
	for k, at := range pending {
		batch = append(batch, store.Hit{Key: k, At: at})
		if len(batch) == flushChunk {
			if err := st.RecordHits(ctx, batch); err != nil {
				h.putBack(pending)
				return written, dropped, err
			}
			for _, hit := range batch {
				delete(pending, hit.Key)
			}
			written += len(batch)
			batch = batch[:0]
		}
	}
	if err := st.RecordHits(ctx, batch); err != nil {
		h.putBack(pending)
		return written, dropped, err
	}
	return written + len(batch), dropped, nil
}

func (h *Hits) putBack(unwritten map[store.Key]time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, at := range unwritten {
		if _, newer := h.pending[k]; !newer && len(h.pending) < h.Max {
			h.pending[k] = at
		}
	}
}
