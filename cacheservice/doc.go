// Package cacheservice will hold the cache service (not written yet): task outputs memoized by a structured
// cache key, and reservations that stop two identical tasks from running at once, in
// Postgres, served over flyte.cache.v1.CacheService.
package cacheservice
