package job_test

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/k8s/job"
)

func condition(t batchv1.JobConditionType, reason string) []batchv1.JobCondition {
	return []batchv1.JobCondition{{Type: t, Status: corev1.ConditionTrue, Reason: reason}}
}

func TestGetTaskPhase(t *testing.T) {
	ctx := context.Background()
	deleting := metav1.NewTime(time.Now())
	one := int32(1)
	tests := []struct {
		name       string
		job        batchv1.Job
		files      map[string]string
		wantPhase  core.Phase
		wantReason string
		wantCode   string
	}{
		{name: "created", wantPhase: core.PhaseInitializing, wantReason: "Pending"},
		{name: "pods started, none ready", job: batchv1.Job{Status: batchv1.JobStatus{Active: 2}},
			wantPhase: core.PhaseInitializing, wantReason: "PodsPending"},
		{name: "running", job: batchv1.Job{Status: batchv1.JobStatus{Active: 2, Ready: &one}}, wantPhase: core.PhaseRunning, wantReason: "Running"},
		{name: "suspended", job: batchv1.Job{Status: batchv1.JobStatus{Conditions: condition(batchv1.JobSuspended, "JobSuspended")}},
			wantPhase: core.PhaseWaitingForResources, wantReason: "Suspended"},
		{name: "terminating", job: batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}, Status: batchv1.JobStatus{Active: 1, Ready: &one}},
			wantPhase: core.PhaseRunning, wantReason: "Terminating"},
		{name: "complete", job: batchv1.Job{Status: batchv1.JobStatus{Conditions: condition(batchv1.JobComplete, "CompletionsReached")}},
			wantPhase: core.PhaseSuccess},
		{name: "complete while terminating counts as complete", job: batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting},
			Status: batchv1.JobStatus{Conditions: condition(batchv1.JobComplete, "CompletionsReached")}}, wantPhase: core.PhaseSuccess},
		{name: "complete with an error document", job: batchv1.Job{Status: batchv1.JobStatus{Conditions: condition(batchv1.JobComplete, "CompletionsReached")}},
			files:     map[string]string{"mem://out/r1/a0/1/error.json": `{"code": "BadInput", "message": "no"}`},
			wantPhase: core.PhaseRetryableFailure, wantCode: "BadInput"},
		{name: "failed", job: batchv1.Job{Status: batchv1.JobStatus{Conditions: condition(batchv1.JobFailed, "DeadlineExceeded")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "DeadlineExceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := datastore.New()
			for uri, content := range tt.files {
				if err := store.Write(ctx, uri, []byte(content)); err != nil {
					t.Fatal(err)
				}
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "mem://out/r1"}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
			j := tt.job
			info, err := job.Plugin{}.GetTaskPhase(ctx, tCtx, &j)
			if err != nil {
				t.Fatal(err)
			}
			if info.Phase != tt.wantPhase || (tt.wantReason != "" && info.Reason != tt.wantReason) {
				t.Fatalf("got %s/%s; want %s/%s", info.Phase, info.Reason, tt.wantPhase, tt.wantReason)
			}
			if tt.wantCode != "" && (info.Err == nil || info.Err.Code != tt.wantCode || info.Err.Kind != core.ErrorKindUser) {
				t.Fatalf("error %+v; want the user's %s", info.Err, tt.wantCode)
			}
		})
	}
}
