package controller

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/tracing"
)

// pluginPhase is the phase a plugin's Handle reported, on its span.
const pluginPhase = attribute.Key("flyte.plugin.phase")

// resolve finds the plugin for a task type, wrapped so that its calls are spans of the
// reconcile.
func (s *scope) resolve(taskType string) (core.Plugin, error) {
	p, err := s.r.Registry.Resolve(taskType)
	if err != nil {
		return nil, err
	}
	return tracedPlugin{Plugin: p, tracer: s.r.tracer()}, nil
}

// tracedPlugin makes a span of each Handle, Abort and Finalize: what a plugin does (such
// as the Kubernetes API calls of the plugin manager) nests under the call that did it.
type tracedPlugin struct {
	core.Plugin
	tracer trace.Tracer
}

func (p tracedPlugin) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	ctx, span := p.start(ctx, "plugin.Handle")
	tr, err := p.Plugin.Handle(ctx, tCtx)
	if span.IsRecording() {
		span.SetAttributes(pluginPhase.String(tr.Info.Phase.String()))
	}
	end(span, err)
	return tr, err
}

func (p tracedPlugin) Abort(ctx context.Context, tCtx core.TaskExecutionContext) error {
	ctx, span := p.start(ctx, "plugin.Abort")
	err := p.Plugin.Abort(ctx, tCtx)
	end(span, err)
	return err
}

func (p tracedPlugin) Finalize(ctx context.Context, tCtx core.TaskExecutionContext) error {
	ctx, span := p.start(ctx, "plugin.Finalize")
	err := p.Plugin.Finalize(ctx, tCtx)
	end(span, err)
	return err
}

// start begins the span of one call of the plugin, naming the core.
func (p tracedPlugin) start(ctx context.Context, name string) (context.Context, trace.Span) {
	return p.tracer.Start(ctx, name, trace.WithAttributes(tracing.Plugin.String(p.GetID())))
}

// end ends a span, marking it failed when err is not nil.
func end(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
