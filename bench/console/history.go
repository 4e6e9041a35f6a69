package consolebench

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// The project and domain the benchmark's runs are recorded in, as the sandbox's
// examples are.
const (
	project = "demo"
	domain  = "development"
)

// tasks name the actions of a run, in turn.
var tasks = []string{"extract", "validate", "transform", "dedupe", "join", "fit", "evaluate", "report", "publish", "cleanup"}

// workflows name the runs, in turn.
var workflows = []string{"nightly-etl", "train-model", "hourly-report", "backfill", "score"}

func runName(i int) string { return fmt.Sprintf("%s-%03d", workflows[i%len(workflows)], i) }

func actionName(j int) string { return fmt.Sprintf("%s-%02d", tasks[j%len(tasks)], j) }

// history is what the benchmark records: runs of actionsPerRun actions, one started
// every ten minutes up to now, each action with the phase history the executor would
// report. Most actions succeed; one in four waits for resources; one in seven fails
// its first attempt with an OOMKilled user error and is retried (in one run in ten the
// retry fails too); one in eleven is a cache hit; one in five has cluster events; the
// newest run is still going.
type history struct {
	runs, actionsPerRun int
	events              []*eventsv1.ActionEvent
	// eventsOf counts each action's events, keyed by run/action.
	eventsOf map[string]int
}

func newHistory(runs, actionsPerRun int, now time.Time) *history {
	h := &history{runs: runs, actionsPerRun: actionsPerRun, eventsOf: map[string]int{}}
	now = now.Truncate(time.Second)
	for i := range runs {
		start := now.Add(-time.Duration(runs-i) * 10 * time.Minute)
		for j := range actionsPerRun {
			evs := actionHistory(i, j, i == runs-1, start.Add(time.Duration(j)*20*time.Second))
			h.events = append(h.events, evs...)
			h.eventsOf[runName(i)+"/"+actionName(j)] = len(evs)
		}
	}
	return h
}

// actionHistory is the events of action j of run i, from start; an action of a run
// still going stops running halfway through the run.
func actionHistory(i, j int, going bool, start time.Time) []*eventsv1.ActionEvent {
	id := &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: runName(i), Action: actionName(j)}
	pod := fmt.Sprintf("%s-%s", id.Run, id.Action)
	var out []*eventsv1.ActionEvent
	at := 0 // seconds after start
	add := func(attempt uint32, phase flytecorev1.ActionPhase, version uint32, reason, message string, edit func(*eventsv1.ActionEvent)) {
		e := &eventsv1.ActionEvent{
			Id: id, Attempt: attempt, Phase: phase, Version: version,
			OccurredAt: timestamppb.New(start.Add(time.Duration(at) * time.Second)),
			ReportedAt: timestamppb.New(start.Add(time.Duration(at)*time.Second + 200*time.Millisecond)),
			Reason:     reason, Message: message, TaskType: "container", Cluster: "sandbox",
		}
		if edit != nil {
			edit(e)
		}
		out = append(out, e)
	}
	logs := func(attempt uint32) func(*eventsv1.ActionEvent) {
		return func(e *eventsv1.ActionEvent) {
			e.LogLinks = []*eventsv1.LogLink{{Name: "pod logs", Uri: fmt.Sprintf("http://127.0.0.1:9/logs/%s-%d", pod, attempt)}}
		}
	}
	oom := func(e *eventsv1.ActionEvent) {
		e.Error = &flytecorev1.ExecutionError{Kind: flytecorev1.ExecutionError_KIND_USER, Code: "OOMKilled",
			Message: "container main exited with code 137: OOMKilled (memory limit 512Mi)"}
	}
	const (
		queued       = flytecorev1.ActionPhase_ACTION_PHASE_QUEUED
		waiting      = flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES
		initializing = flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING
		running      = flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
		succeeded    = flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
		failed       = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
	)

	add(1, queued, 0, "Queued", "", nil)
	if j%11 == 5 {
		at++
		add(1, succeeded, 0, "CacheHit", "outputs read from the cache", func(e *eventsv1.ActionEvent) {
			e.CacheStatus = flytecorev1.CacheStatus_CACHE_STATUS_HIT
			e.OutputsUri = "file:///tmp/flyte-sandbox/outputs/" + pod
		})
		return out
	}
	attempts := uint32(1)
	if j%7 == 3 {
		attempts = 2
	}
	for attempt := uint32(1); attempt <= attempts; attempt++ {
		if attempt > 1 {
			at += 5
			add(attempt, queued, 0, "Retrying", "retrying after a user error (retry 1 of 2)", oom)
		}
		if j%4 == 1 {
			at++
			add(attempt, waiting, 0, "WaitingForResources", "0/1 nodes are available: 1 Insufficient memory", nil)
			at += 3 + j%5
		}
		at++
		add(attempt, initializing, 0, "Initializing", "pulling image ghcr.io/flyteorg/flytekit:py3.12", nil)
		at += 2
		add(attempt, running, 0, "Running", "pod "+pod+" is running", logs(attempt))
		if j%5 == 0 {
			at += 4
			add(attempt, running, 1, "Running", "pod "+pod+" is running", func(e *eventsv1.ActionEvent) {
				logs(attempt)(e)
				e.ClusterEvents = []*eventsv1.ClusterEvent{{
					OccurredAt: timestamppb.New(start.Add(time.Duration(at) * time.Second)), Object: "Pod/" + pod, Type: "Warning",
					Reason: "BackOff", Message: "Back-off restarting failed container main", Count: 2,
				}}
			})
		}
		if going && j >= 10 {
			return out // still running
		}
		at += 5 + (i*7+j*13)%115
		switch {
		case attempt < attempts:
			// the retry's queued event carries the error
		case attempts > 1 && i%10 == 0:
			add(attempt, failed, 0, "RetriesExhausted", "", oom)
		default:
			add(attempt, succeeded, 0, "Succeeded", "", func(e *eventsv1.ActionEvent) {
				e.OutputsUri = "file:///tmp/flyte-sandbox/outputs/" + pod
				if j%3 == 0 {
					e.CacheStatus = flytecorev1.CacheStatus_CACHE_STATUS_POPULATED
				}
			})
		}
	}
	return out
}
