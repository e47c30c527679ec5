# syntax=docker/dockerfile:1
# Build agent-sandbox on Debian bookworm and ship it on bookworm-slim (the same glibc,
# 2.36: children are started with glibc's posix_spawn extensions, 2.34+), with the tools
# sandbox callers expect (bash for /shell, git for the dev tools). Both base images are
# pinned to exact versions, so a rebuild gets the same toolchain and libraries.

FROM rust:1.95.0-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own: every target the manifest declares is
# a placeholder here, so a change to src/ rebuilds only the server's own packages below.
COPY Cargo.toml Cargo.lock build.rs ./
COPY core/Cargo.toml ./core/
COPY engine/Cargo.toml ./engine/
RUN mkdir -p src/bin benches tests/it \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs src/engine.rs \
 && echo 'fn main() {}' > src/bin/embed-example.rs \
 && echo 'fn main() {}' > benches/hot_paths.rs \
 && touch tests/it/main.rs \
 && cargo build --release --locked --bin agent-sandbox \
 && rm -rf src benches tests
COPY src ./src
COPY benches ./benches
COPY tests ./tests
# The placeholders' build stamps are newer than the copied sources; touch makes the
# crate itself rebuild.
RUN touch src/main.rs src/lib.rs src/engine.rs \
 && cargo build --release --locked --bin agent-sandbox \
 && strip target/release/agent-sandbox

FROM debian:12.12-slim
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --home-dir /home/user --shell /bin/bash user
COPY --from=build /src/target/release/agent-sandbox /usr/local/bin/agent-sandbox
USER user
WORKDIR /home/user
ENV ABX_SERVER_BASE_DIR=/home/user
# 9000: the HTTP API; 9001: the PTY WebSocket (terminal group); 8888: the k8s_runtime
# group (kubernetes-sigs/agent-sandbox's runtime contract), when enabled.
EXPOSE 9000 9001 8888
# The binary probes itself (the image needs no curl), reading the same ABX_* environment
# as the server: move the port with -e ABX_SERVER_PORT, not with a flag, or the probe
# asks the default port.
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/agent-sandbox", "--health-check"]
# Docker's default seccomp profile refuses io_uring; the server then falls back to epoll
# and says so. Run with --security-opt seccomp=<profile allowing io_uring> to keep it.
ENTRYPOINT ["/usr/local/bin/agent-sandbox"]
