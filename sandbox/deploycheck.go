package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
)

// eventsClient reads the events service.
type eventsClient = eventsv1connect.EventsServiceClient

// newEventsClient calls the deployed events service over TLS, trusting caFile, with the
// token in tokenFile.
func newEventsClient(caFile, tokenFile string) (eventsClient, error) {
	hc, err := rpcclient.New(rpcclient.Options{CAFile: caFile, TokenFile: tokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	return eventsv1connect.NewEventsServiceClient(hc, deployedEvents), nil
}

// refusesWithoutToken checks that the deployed events service turns away a caller that
// shows no token: authentication is on, as shipped.
func refusesWithoutToken(ctx context.Context, caFile string) error {
	anonymous, err := newEventsClient(caFile, "")
	if err != nil {
		return err
	}
	_, err = anonymous.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: demoNamespace, Domain: "development"}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		return fmt.Errorf("sandbox: the events service answered a call without a token with %v; want Unauthenticated", err)
	}
	return nil
}

// protoPhases are the contract's names of the action phases.
var protoPhases = map[flytev1.Phase]flytecorev1.ActionPhase{
	flytev1.PhaseQueued:              flytecorev1.ActionPhase_ACTION_PHASE_QUEUED,
	flytev1.PhaseWaitingForResources: flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES,
	flytev1.PhaseInitializing:        flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING,
	flytev1.PhaseRunning:             flytecorev1.ActionPhase_ACTION_PHASE_RUNNING,
	flytev1.PhaseSucceeded:           flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED,
	flytev1.PhaseFailed:              flytecorev1.ActionPhase_ACTION_PHASE_FAILED,
	flytev1.PhaseAborted:             flytecorev1.ActionPhase_ACTION_PHASE_ABORTED,
	flytev1.PhaseTimedOut:            flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT,
}

// checkEvents reads each action afresh and says which of its history entries the events
// service does not hold exactly once, and which action it holds in another state.
func checkEvents(ctx context.Context, c client.Client, events eventsClient, actions []*flytev1.TaskAction) []string {
	var problems []string
	for _, ta := range actions {
		var got flytev1.TaskAction
		if err := c.Get(ctx, client.ObjectKeyFromObject(ta), &got); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", ta.Name, err))
			continue
		}
		id := &flytecorev1.ActionIdentifier{Project: got.Spec.Project, Domain: got.Spec.Domain, Run: got.Spec.RunName, Action: got.Spec.ActionName}
		stored, err := storedEvents(ctx, events, id)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", ta.Name, err))
			continue
		}
		for _, h := range got.Status.PhaseHistory {
			key := fmt.Sprintf("attempt %d %s v%d", h.Attempt, h.Phase, h.Version)
			if n := stored[key]; n != 1 {
				problems = append(problems, fmt.Sprintf("%s: %s stored %d times", ta.Name, key, n))
			}
		}
	}
	return problems
}

// storedEvents counts an action's events in the events service by attempt, phase and
// version.
func storedEvents(ctx context.Context, events eventsClient, id *flytecorev1.ActionIdentifier) (map[string]int, error) {
	names := map[flytecorev1.ActionPhase]flytev1.Phase{}
	for k, v := range protoPhases {
		names[v] = k
	}
	counts := map[string]int{}
	token := ""
	for {
		resp, err := events.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 1000, PageToken: token}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return counts, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing its events: %w", err)
		}
		for _, e := range resp.Msg.GetEvents() {
			counts[fmt.Sprintf("attempt %d %s v%d", e.GetAttempt(), names[e.GetPhase()], e.GetVersion())]++
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return counts, nil
		}
	}
}

// decodeManifests reads a stream of YAML documents into objects, skipping empty ones.
func decodeManifests(raw []byte) ([]*unstructured.Unstructured, error) {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []*unstructured.Unstructured
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox: reading manifests: %w", err)
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("sandbox: reading manifests: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}
