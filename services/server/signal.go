package server

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// SignalContext returns a context cancelled by SIGTERM (what Kubernetes and docker send
// to stop a container) or SIGINT (Ctrl-C). Passing it to Serve turns either signal into a
// graceful shutdown; a second signal kills the process the default way.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := signal.NotifyContext(parent, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		cancel() // restores default handling, so a second signal is not swallowed
	}()
	return ctx, cancel
}
