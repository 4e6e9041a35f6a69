// Command cacheservice serves flyte.cache.v1.CacheService: memoized task outputs and the
// reservations that keep identical tasks from running at once, in Postgres.
package main

import (
	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/services/app"
)

func main() { app.Main("cacheservice", cacheservice.Flags, cacheservice.Run) }
