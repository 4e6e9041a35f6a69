# syntax=docker/dockerfile:1
# The development credentials image: ./deploy/docker/devcreds, static, on distroless as
# uid 65532. docker compose runs it once, before the services, to make (or keep) the CA,
# the serving certificate and the tokens in its dev-credentials volume. It is for a
# laptop only: no cluster manifest runs it. From the repository root:
#
#   docker build -f deploy/docker/devcreds.Dockerfile -t ghcr.io/flytekube/devcreds:latest .
#
# deploy/compose_test.go checks this file against the code (package, user).

# The Go of go.mod's "go" line. The build runs on the builder's own platform and
# cross-compiles for the target, so multi-platform builds need no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/devcreds ./deploy/docker/devcreds

# No shell, no package manager. Its home, /home/nonroot, belongs to uid 65532: a new
# volume mounted there takes that owner, which is how the volume becomes writable to it.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="devcreds" \
      org.opencontainers.image.description="Development credentials for the Flyte services under docker compose: a private CA, a serving certificate and static tokens" \
      org.opencontainers.image.source="https://github.com/flytekube/backend" \
      org.opencontainers.image.url="https://github.com/flytekube/backend" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"
COPY --from=build /out/devcreds /devcreds
# The nonroot image's user, spelt as numbers so that Kubernetes' runAsNonRoot can check it.
USER 65532:65532
ENTRYPOINT ["/devcreds"]
