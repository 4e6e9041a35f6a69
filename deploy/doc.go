// Package deploy holds no code: its test renders the kustomize overlays under
// deploy/kustomize and has a real API server admit every object they contain.
package deploy
