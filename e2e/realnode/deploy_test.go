package realnode_test

import (
	"context"
	"testing"
	"time"

	"github.com/flytekube/backend/sandbox"
)

// TestDeployedOnTheNode is make deploy-node on this package's node: the shipped base,
// through the node overlay, from images built here, runs the examples to their expected
// ends with everything in pods (the executor calling the services with its projected
// token, the services reviewing it), and a rolling restart of each Deployment loses no
// event. Deploy takes it all down again, so the tests after it have the node to
// themselves.
func TestDeployedOnTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := sandbox.Deploy(ctx, sandbox.DeployOptions{Node: node, RollingRestart: true, Timeout: 4 * time.Minute}, t.Output()); err != nil {
		t.Fatal(err)
	}
}
