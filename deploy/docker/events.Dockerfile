# syntax=docker/dockerfile:1
# The events service image: ./events/cmd/events, static, on distroless as uid 65532, with
# /healthcheck beside it for docker compose (the image has no shell). From the repository root:
#
#   docker build -f deploy/docker/events.Dockerfile -t ghcr.io/flytekube/events:$(make -s version) \
#     --build-arg VERSION=$(make -s version) --build-arg REVISION=$(git rev-parse HEAD) .
#
# deploy/compose_test.go checks this file against the code (package, ports, user).

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
# The release and commit the binary says it is (--version, build_info), as the labels
# below; declared here, so that a new version leaves the module download cached.
ARG VERSION=dev
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X github.com/flytekube/backend/internal/buildinfo.version=$VERSION -X github.com/flytekube/backend/internal/buildinfo.commit=$REVISION" -o /out/events ./events/cmd/events && \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/healthcheck ./deploy/docker/healthcheck

# No shell, no package manager: CA certificates, tzdata and /etc/passwd with nonroot.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="events" \
      org.opencontainers.image.description="Flyte action events, recorded in Postgres and served over Connect, gRPC and gRPC-Web" \
      org.opencontainers.image.source="https://github.com/flytekube/backend" \
      org.opencontainers.image.url="https://github.com/flytekube/backend" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"
COPY --from=build /out/events /events
COPY --from=build /out/healthcheck /healthcheck
# The nonroot image's user, spelt as numbers so that Kubernetes' runAsNonRoot can check it.
USER 65532:65532
# Connect, gRPC and gRPC-Web (--listen); Prometheus /metrics (--metrics-listen).
EXPOSE 8090 9090
ENTRYPOINT ["/events"]
