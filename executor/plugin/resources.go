package plugin

import (
	"context"
	"fmt"
	"sync"
)

// TokenPools is a ResourceManager of named pools, each with a quota of tokens held at
// once. It lives in the executor's memory: only the leader reconciles, and after a
// restart every running attempt takes its token again on its next Handle (Allocate is
// idempotent), so the pools rebuild themselves.
type TokenPools struct {
	mu    sync.Mutex
	quota map[string]int
	held  map[string]map[string]struct{}
}

var _ ResourceManager = (*TokenPools)(nil)

// NewTokenPools creates pools with the given quotas.
func NewTokenPools(quotas map[string]int) *TokenPools {
	p := &TokenPools{quota: make(map[string]int), held: make(map[string]map[string]struct{})}
	for name, q := range quotas {
		p.quota[name] = q
		p.held[name] = make(map[string]struct{})
	}
	return p
}

// Allocate implements ResourceManager.
func (p *TokenPools) Allocate(_ context.Context, pool, token string) (AllocationStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, ok := p.held[pool]
	if !ok {
		return 0, fmt.Errorf("plugin: no resource pool %q", pool)
	}
	if _, ok := held[token]; ok {
		return AllocationGranted, nil
	}
	if len(held) >= p.quota[pool] {
		return AllocationExhausted, nil
	}
	held[token] = struct{}{}
	return AllocationGranted, nil
}

// Release implements ResourceManager.
func (p *TokenPools) Release(_ context.Context, pool, token string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, ok := p.held[pool]
	if !ok {
		return fmt.Errorf("plugin: no resource pool %q", pool)
	}
	delete(held, token)
	return nil
}
