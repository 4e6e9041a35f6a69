// Package events will hold the events service (not written yet): it records every action event the executor
// reports, idempotently, in Postgres, folds them into the latest state of each action,
// and serves both back (get, list, live watch) over flyte.events.v1.EventsService.
package events
