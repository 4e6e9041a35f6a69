// Package deploy holds no code: its tests render the kustomize overlays under
// deploy/kustomize and have a real API server admit every object they contain, hold
// their security (auth modes, TLS, the executor's token and CA, NetworkPolicies) to what
// the services need, and run the docker compose topology as processes.
package deploy
