package events

import (
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
)

// APIGroup is the API group of the events service's virtual resources: RBAC rules name
// it to grant "events" (write) and "actions" (read) per project.
const APIGroup = "events.flyte.org"

// Rules say what each RPC needs, in the project it names.
func Rules() auth.Rules {
	read := func(verb string, project func(any) string) auth.Rule {
		return auth.Rule{Group: APIGroup, Resource: "actions", Verb: verb, Projects: func(m any) []string { return []string{project(m)} }}
	}
	return auth.Rules{
		eventsv1connect.EventsServiceRecordProcedure: {
			Group: APIGroup, Resource: "events", Verb: auth.VerbCreate, Projects: recordProjects, Clusters: recordClusters,
		},
		eventsv1connect.EventsServiceGetActionProcedure: read(auth.VerbGet, func(m any) string {
			return m.(*eventsv1.GetActionRequest).GetId().GetProject()
		}),
		eventsv1connect.EventsServiceListActionEventsProcedure: read(auth.VerbGet, func(m any) string {
			return m.(*eventsv1.ListActionEventsRequest).GetId().GetProject()
		}),
		eventsv1connect.EventsServiceListActionsProcedure: read(auth.VerbList, func(m any) string {
			return m.(*eventsv1.ListActionsRequest).GetProject()
		}),
		eventsv1connect.EventsServiceWatchActionsProcedure: read(auth.VerbWatch, func(m any) string {
			return m.(*eventsv1.WatchActionsRequest).GetProject()
		}),
		// The CloudEvents egress is the cluster's, not a project's: its dead letters hold
		// events of every project.
		eventsv1connect.EgressServiceListSinksProcedure:         {Group: APIGroup, Resource: "sinks", Verb: auth.VerbList},
		eventsv1connect.EgressServiceListDeadLettersProcedure:   {Group: APIGroup, Resource: "deadletters", Verb: auth.VerbList},
		eventsv1connect.EgressServiceReplayDeadLettersProcedure: {Group: APIGroup, Resource: "deadletters", Verb: auth.VerbUpdate},
	}
}

// recordProjects lists each project of a batch once: every one must be allowed.
func recordProjects(m any) []string {
	return eachOnce(m, func(e *eventsv1.ActionEvent) string { return e.GetId().GetProject() })
}

// recordClusters lists each cluster a batch's events name once: an executor bound to a
// cluster may record only that cluster's actions.
func recordClusters(m any) []string {
	return eachOnce(m, (*eventsv1.ActionEvent).GetCluster)
}

// eachOnce lists field of a batch's events, each value once, in the batch's order.
func eachOnce(m any, field func(*eventsv1.ActionEvent) string) []string {
	var values []string
	seen := map[string]bool{}
	for _, e := range m.(*eventsv1.RecordRequest).GetEvents() {
		if v := field(e); !seen[v] {
			seen[v] = true
			values = append(values, v)
		}
	}
	return values
}
