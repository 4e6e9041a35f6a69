package relay

import (
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
)

// converted keeps the CloudEvents made of recent entries, so that each event is converted
// once however many sinks publish it (converting was a third of the relay's CPU with
// three sinks). Sinks only read an event. It holds at most max events, dropping the
// oldest first; a sink far behind the others converts for itself.
type converted struct {
	cluster string
	max     int

	mu     sync.Mutex
	events map[outbox.Position]event.Event
	order  []outbox.Position // oldest first
}

func newConverted(cluster string, max int) *converted {
	return &converted{cluster: cluster, max: max, events: make(map[outbox.Position]event.Event, max)}
}

// get returns the CloudEvent of e, converting it if no sink did yet.
func (c *converted) get(e outbox.Entry) (event.Event, error) {
	c.mu.Lock()
	ce, ok := c.events[e.Position]
	c.mu.Unlock()
	if ok {
		return ce, nil
	}
	ce, err := cloudevents.Convert(e.Event, c.cluster)
	if err != nil {
		return event.Event{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.events[e.Position]; !ok {
		c.events[e.Position] = ce
		c.order = append(c.order, e.Position)
		for len(c.order) > c.max {
			delete(c.events, c.order[0])
			c.order = c.order[1:]
		}
	}
	return ce, nil
}
