// Package deploy holds no code: its tests render the kustomize overlays under
// deploy/kustomize, have a real API server admit every object they contain and say what
// their RBAC allows, hold their security (auth modes, TLS, the executor's token and CA,
// NetworkPolicies) to what the services need, check docker-compose.yaml, the Dockerfiles
// and the .dockerignore with the parsers Docker itself uses, run the docker compose
// topology as processes, and run the Argo CD health check of argocd/ as Argo CD does.
package deploy
