package job_test

import (
	"context"
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/k8s/job"
)

// TestJobPodsGetTheSecrets: the Job's pod template refers to the action's secrets, as a
// task's pod does, and a spec the pod cannot carry is refused.
func TestJobPodsGetTheSecrets(t *testing.T) {
	for _, tt := range []struct {
		name    string
		secrets []flytev1.TaskSecret
		wantErr bool
	}{
		{name: "env and a volume", secrets: []flytev1.TaskSecret{{Name: "db", Key: "password", Env: "DB_PASSWORD"}, {Name: "tls", MountPath: "/etc/tls"}}},
		{name: "the executor's variable", secrets: []flytev1.TaskSecret{{Name: "db", Key: "a", Env: "FLYTE_ATTEMPT"}}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "mem://out/r1",
				Container: &flytev1.ContainerSpec{Image: "busybox"}, Secrets: tt.secrets}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: datastore.New()})
			obj, err := job.Plugin{}.BuildResource(context.Background(), tCtx)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("built %+v", obj)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := obj.(*batchv1.Job).Spec.Template.Spec
			c := spec.Containers[0]
			last := c.Env[len(c.Env)-1]
			if last.Name != "DB_PASSWORD" || last.ValueFrom == nil || last.ValueFrom.SecretKeyRef == nil || last.ValueFrom.SecretKeyRef.Name != "db" {
				t.Fatalf("last variable %+v", last)
			}
			if len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != "tls" ||
				len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/tls" || !c.VolumeMounts[0].ReadOnly {
				t.Fatalf("volumes %+v, mounts %+v", spec.Volumes, c.VolumeMounts)
			}
		})
	}
}
