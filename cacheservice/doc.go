// Package cacheservice runs the cache service: task outputs memoized under a structured
// cache key, and reservations that stop two identical tasks from running at once, kept in
// Postgres (store) and served over flyte.cache.v1.CacheService (service). Run wires them
// together; cmd/cacheservice is the binary.
package cacheservice
