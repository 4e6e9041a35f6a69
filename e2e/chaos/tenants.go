package chaos

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/executor/cacheclient"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/test/systemtest"
)

// checkHostile holds a hostile action to its end: failed with the error code that names
// what it tried, alone. A forged one wrote no history (so nothing reached the events
// service under the project it named); a takeover got no pod.
func (ch *checker) checkHostile(ctx context.Context, p *plan, r actionRecord, add func(string, ...any)) {
	st := r.last.Status
	code := ""
	if st.Error != nil {
		code = st.Error.Code
	}
	who := "hostile " + p.name
	if p.victim != "" {
		who += " (forging chaos action " + p.victim + ")"
	}
	switch {
	case r.gone && !st.Phase.IsTerminal():
		add("%s: gone although nobody deleted it (last phase %s)", who, systemtest.PhaseOrNone(string(st.Phase)))
	case st.Phase != p.expect || code != p.code:
		add("%s: %s with error code %q, want %s with %s (reason %s)", who, systemtest.PhaseOrNone(string(st.Phase)), code, p.expect, p.code, systemtest.ProgressingReason(r.last))
	}
	if forged(p.kind) {
		if n := len(st.PhaseHistory); n > 0 {
			add("%s: wrote %d history entries under project %s; want none", who, n, p.action.Spec.Project)
		}
		return
	}
	if p.kind == kindTakeover {
		if n := ch.obs.podsOf(p.name); n > 0 {
			add("%s: %d pods created; want none", who, n)
		}
	}
	ch.checkWatchers(p, ch.checkEvents(ctx, p, r.last, false, r.endUnseen, add), add)
}

// checkTenants finds any trace of the hostile tenant in the chaos tenant's data: 0
// cross-project reads or writes. Each finding says "cross-project".
func (ch *checker) checkTenants(ctx context.Context, add func(string, ...any)) {
	chaosNames := map[string]bool{}
	for _, p := range ch.w.plans {
		if !p.hostile {
			chaosNames[p.name] = true
		}
	}
	// Every action the events service knows of project chaos is a chaos action of run
	// soak.
	actions, err := systemtest.ListActions(ctx, ch.s.viewer, "chaos", "development")
	if err != nil {
		add("ListActions of project chaos: %v", err)
	}
	for _, a := range actions {
		if id := a.GetId(); id.GetRun() != "soak" || !chaosNames[id.GetAction()] {
			add("cross-project write: the events service holds action %s/%s of project chaos, which no chaos action is", id.GetRun(), id.GetAction())
		}
	}
	for _, p := range ch.w.plans {
		switch p.kind {
		case kindForgeEcho:
			// The victim echoes nothing: an echo's event or outputs under its name are
			// the forger's.
			v := ch.w.byName[p.victim]
			spec := v.action.Spec
			events, err := systemtest.ListActionEvents(ctx, ch.s.viewer, idOf(spec.Project, spec.Domain, spec.RunName, spec.ActionName))
			if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
				add("%s: ListActionEvents: %v", p.victim, err)
			}
			for _, e := range events {
				if e.GetTaskType() != spec.TaskType {
					add("cross-project write: chaos action %s (%s) has an event of task type %s, hostile %s's", p.victim, spec.TaskType, e.GetTaskType(), p.name)
					break
				}
			}
			if f := findFile(localPath(spec.RunOutputBase), func(path string) bool { return filepath.Base(path) == "outputs.json" }); f != "" {
				add("cross-project read and write: %s holds outputs, but chaos action %s (%s) writes none: hostile %s echoed its input there", f, p.victim, spec.TaskType, p.name)
			}
		case kindForgeWrite:
			base := localPath(ch.w.byName[p.victim].action.Spec.RunOutputBase)
			if f := findFile(base, hasMark); f != "" {
				add("cross-project write: %s, chaos action %s's, holds hostile %s's input", f, p.victim, p.name)
			}
		}
	}
	ch.checkCache(ctx, add)
}

// checkCache holds each chaos cached-echo group's cache entry to having come from a
// chaos action, with outputs in the chaos tenant's store: hostile's forge-cache names
// the same key with outputs of its own.
func (ch *checker) checkCache(ctx context.Context, add func(string, ...any)) {
	seen := map[string]bool{}
	hostileBase := localPath("file://" + filepath.ToSlash(filepath.Join(ch.s.dataDir, "outputs", hostileNamespace)))
	for _, p := range ch.w.plans {
		if p.hostile || p.kind != kindCachedEcho || seen[p.action.Spec.TaskName] {
			continue
		}
		seen[p.action.Spec.TaskName] = true
		spec := p.action.Spec
		inputs, err := os.ReadFile(localPath(spec.InputURI))
		if err != nil {
			add("cache of %s: %v", spec.TaskName, err)
			continue
		}
		hash, err := cacheclient.InputsHash(inputs, nil)
		if err != nil {
			add("cache of %s: %v", spec.TaskName, err)
			continue
		}
		key := &cachev1.CacheKey{Project: spec.Project, Domain: spec.Domain, TaskName: spec.TaskName, CacheVersion: spec.Cache.Version,
			Signature: cacheclient.Signature(&spec), InputsHash: hash}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := ch.s.cacheReader.Get(cctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
		cancel()
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			continue
		case err != nil:
			add("cache of %s: Get: %v", spec.TaskName, err)
			continue
		}
		out := got.Msg.GetOutput()
		src := out.GetSourceAction()
		if strings.HasPrefix(localPath(out.GetOutputUri()), hostileBase) || src.GetRun() != "soak" || !ch.w.isChaos(src.GetAction()) {
			add("cross-project write: the cache entry of chaos %s points at %s, made by %s/%s", spec.TaskName, out.GetOutputUri(), src.GetRun(), src.GetAction())
		}
	}
}

// isChaos says name is a chaos action's.
func (w *workload) isChaos(name string) bool {
	p := w.byName[name]
	return p != nil && !p.hostile
}

// localPath is the file a file:// URI names.
func localPath(uri string) string { return filepath.FromSlash(strings.TrimPrefix(uri, "file://")) }

// findFile returns the first file under dir that match accepts ("" when none, or no dir).
func findFile(dir string, match func(path string) bool) string {
	found := ""
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found != "" {
			return nil
		}
		if d.Type().IsRegular() && match(path) {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

func idOf(project, domain, run, action string) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: run, Action: action}
}
