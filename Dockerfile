# syntax=docker/dockerfile:1
#
# gpu-extender container image: a Rust build stage, then only the binary on a distroless base
# (glibc, CA certificates, no shell, no package manager) running as an unprivileged user.
#
#   docker build --build-arg SOURCE_COMMIT=$(git rev-parse HEAD) -t gpu-extender:0.1.0 .
#   make image        (the same, with Docker or Podman, tagged with Cargo.toml's version)
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts. docs/install.md has
# the details (multi-arch builds, pushing, pointing deploy/ at the image).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
# The commit the image is built from. The build context has no .git, so without it
# `gpu-extender --version` and the gpu_extender_build_info metric say "unknown". The RUN below
# sees it as the variable SOURCE_COMMIT, which build.rs reads.
ARG SOURCE_COMMIT=
WORKDIR /build
# Only what the build reads (see .dockerignore): the workspace manifest and lock file, the build
# script and the .proto files it compiles, the service's sources, the bench target its manifest
# declares, and the workspace's member crates (cargo loads every member's manifest; only the
# engine is compiled into the service).
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY benches ./benches
COPY crates ./crates
# --locked: exactly the dependency versions in Cargo.lock, or fail. -p: the service alone, never
# the lab (gpu-lab) or the test tooling.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --release --locked -p gpu-extender --bin gpu-extender \
    && install -D -m 0755 target/release/gpu-extender /out/gpu-extender

# Debian 12 like the builder, so the binary's glibc matches.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="gpu-extender" \
      org.opencontainers.image.description="GPU-aware placement for Kubernetes: a kube-scheduler extender" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/gpu-extender /usr/local/bin/gpu-extender
# distroless "nonroot": uid/gid 65532, as deploy/deployment.yaml's securityContext expects.
USER 65532:65532
# 8888: the extender verbs (loopback in deploy/); 9090: /healthz, /readyz, /metrics, /inspect.
EXPOSE 8888 9090
ENTRYPOINT ["/usr/local/bin/gpu-extender"]
CMD ["serve"]
