// Package events runs the events service: every action event the executor reports is
// recorded idempotently in Postgres (store), folded into the latest state of each action,
// and served back over flyte.events.v1.EventsService (service), with live watches fed by
// Postgres LISTEN/NOTIFY (watch). Run wires them together; cmd/events is the binary.
package events
