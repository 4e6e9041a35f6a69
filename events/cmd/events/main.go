// Command events serves flyte.events.v1.EventsService: action events recorded
// idempotently in Postgres, the latest state of each action, and live watches.
package main

import (
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/services/app"
)

func main() { app.Main("events", events.Flags, events.Run) }
