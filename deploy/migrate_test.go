package deploy_test

import (
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestMigrationsRunAsTheirOwnStep: in every overlay each service's migrations run in a
// Job of their own (the service's migrate command, with no probe to kill a long one),
// and the service's pods wait for them in an init container, not ready and not killed,
// then serve in wait mode, which applies nothing and refuses a schema too new for them.
func TestMigrationsRunAsTheirOwnStep(t *testing.T) {
	for _, overlay := range []string{"dev", "production", "node"} {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, filepath.Join("deploy", "kustomize", "overlays", overlay))
			jobs := map[string]batchv1.Job{} // by the image's name
			for _, u := range objs {
				if u.GetKind() == "Job" {
					var j batchv1.Job
					convert(t, u, &j)
					for _, c := range j.Spec.Template.Spec.Containers {
						jobs[imageName(c.Image)] = j
					}
				}
			}
			for _, s := range serversOf(t, objs) {
				name := imageName(s.c.Image)
				if mode := s.args["migrate"]; mode != "wait" {
					t.Errorf("Deployment %s: --migrate=%s; want wait: its migrations run in a Job", s.d.Name, mode)
				}
				checkSchemaWait(t, s.d, s.c)
				job, ok := jobs[name]
				if !ok {
					t.Errorf("no Job runs the migrations of %s", name)
					continue
				}
				checkMigrateJob(t, job, s.c)
			}
		})
	}
}

func imageName(image string) string {
	name, _, _ := strings.Cut(path.Base(image), ":")
	return name
}

// checkSchemaWait: the pod's init container is the server's image waiting for the
// schema (and exiting), with the server's database.
func checkSchemaWait(t *testing.T, d appsv1.Deployment, server corev1.Container) {
	t.Helper()
	inits := d.Spec.Template.Spec.InitContainers
	i := slices.IndexFunc(inits, func(c corev1.Container) bool { return c.Image == server.Image })
	if i < 0 {
		t.Errorf("Deployment %s: no init container of %s waits for the schema", d.Name, server.Image)
		return
	}
	c := inits[i]
	flags, err := parseFlags("./"+imageName(c.Image)+"/cmd/"+imageName(c.Image), c.Args)
	switch {
	case err != nil:
		t.Errorf("Deployment %s init container %s: %v", d.Name, c.Name, err)
	case flags.values["migrate"] != "wait-and-exit" || len(flags.args) > 0:
		t.Errorf("Deployment %s init container %s: args %q; want --migrate=wait-and-exit", d.Name, c.Name, c.Args)
	}
	if !sameDatabase(c, server) {
		t.Errorf("Deployment %s init container %s: DATABASE_URL %v; want the server's, %v", d.Name, c.Name, c.Env, server.Env)
	}
}

// checkMigrateJob: the Job runs the server's image's migrate command on the server's
// database, with no probe, retried by the Job controller when it fails.
func checkMigrateJob(t *testing.T, j batchv1.Job, server corev1.Container) {
	t.Helper()
	spec := j.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Errorf("Job %s: %d containers; want one", j.Name, len(spec.Containers))
		return
	}
	c := spec.Containers[0]
	if c.Image != server.Image {
		t.Errorf("Job %s: image %s; want the server's, %s", j.Name, c.Image, server.Image)
	}
	if len(c.Args) == 0 || c.Args[0] != "migrate" {
		t.Errorf("Job %s: args %q; want the migrate command", j.Name, c.Args)
	} else if flags, err := parseFlags("./"+imageName(c.Image)+"/cmd/"+imageName(c.Image), c.Args[1:]); err != nil || len(flags.args) > 0 {
		t.Errorf("Job %s: args %q: %v, arguments %q", j.Name, c.Args, err, flags.args)
	}
	if c.StartupProbe != nil || c.LivenessProbe != nil {
		t.Errorf("Job %s: a probe could kill a long migration", j.Name)
	}
	if !sameDatabase(c, server) {
		t.Errorf("Job %s: DATABASE_URL %v; want the server's, %v", j.Name, c.Env, server.Env)
	}
	if j.Spec.BackoffLimit == nil || *j.Spec.BackoffLimit < 1 {
		t.Errorf("Job %s: backoffLimit %v; want it retried", j.Name, j.Spec.BackoffLimit)
	}
	if j.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("Job %s: activeDeadlineSeconds would kill a long migration", j.Name)
	}
}

// sameDatabase: both containers read DATABASE_URL from the same place.
func sameDatabase(a, b corev1.Container) bool {
	find := func(c corev1.Container) *corev1.EnvVar {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DATABASE_URL" })
		if i < 0 {
			return nil
		}
		return &c.Env[i]
	}
	ea, eb := find(a), find(b)
	return ea != nil && eb != nil && ea.Value == eb.Value &&
		(ea.ValueFrom == nil) == (eb.ValueFrom == nil) &&
		(ea.ValueFrom == nil || *ea.ValueFrom.SecretKeyRef == *eb.ValueFrom.SecretKeyRef)
}
