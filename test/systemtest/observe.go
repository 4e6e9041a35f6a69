package systemtest

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"time"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// IsLeader says whether the executor serving metricsURL leads: controller-runtime's
// leader_election_master_status gauge is 1 on the leader alone.
func IsLeader(ctx context.Context, metricsURL string) bool {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "leader_election_master_status{") && strings.HasSuffix(line, " 1") {
			return true
		}
	}
	return false
}

// ProgressingReason is the reason and message of an action's Progressing condition, for
// a failure's message.
func ProgressingReason(ta *flytev1.TaskAction) string {
	for _, c := range ta.Status.Conditions {
		if c.Type == flytev1.ConditionProgressing {
			return c.Reason + ": " + c.Message
		}
	}
	return "none"
}

// PhaseOrNone names an action's phase, or says it has none yet.
func PhaseOrNone(s string) string {
	if s == "" {
		return "no phase"
	}
	return s
}
