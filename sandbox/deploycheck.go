package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
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
			key := fmt.Sprintf("attempt %d %s v%d", h.Attempt, contractPhase(h.Phase), h.Version)
			if n := stored[key]; n != 1 {
				problems = append(problems, fmt.Sprintf("%s: %s stored %d times", ta.Name, key, n))
			}
		}
	}
	return problems
}

// storedEvents counts an action's events in the events service by attempt, phase (the
// contract's name) and version.
func storedEvents(ctx context.Context, events eventsClient, id *flytecorev1.ActionIdentifier) (map[string]int, error) {
	evs, err := listActionEvents(ctx, events, id)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing its events: %w", err)
	}
	counts := map[string]int{}
	for _, e := range evs {
		counts[fmt.Sprintf("attempt %d %s v%d", e.GetAttempt(), e.GetPhase(), e.GetVersion())]++
	}
	return counts, nil
}

// listActionEvents reads every event of an action, page by page.
func listActionEvents(ctx context.Context, events eventsClient, id *flytecorev1.ActionIdentifier) ([]*eventsv1.ActionEvent, error) {
	var out []*eventsv1.ActionEvent
	token := ""
	for {
		resp, err := events.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 1000, PageToken: token}))
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Msg.GetEvents()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// contractPhase is the contract's name of a phase, derived from its name rather than
// taken from the executor's table, so that a wrong entry there shows: "TimedOut" is
// ACTION_PHASE_TIMED_OUT.
func contractPhase(p flytev1.Phase) string {
	words := regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(string(p), "${1}_${2}")
	return "ACTION_PHASE_" + strings.ToUpper(words)
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
