# syntax=docker/dockerfile:1
# Build agent-sandbox on Debian bookworm and ship it on bookworm-slim (the same glibc,
# 2.36: children are started with glibc's posix_spawn extensions, 2.34+), with the tools
# sandbox callers expect (bash for /shell, git for the dev tools).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked --bin agent-sandbox \
 && strip target/release/agent-sandbox

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --home-dir /home/user --shell /bin/bash user
COPY --from=build /src/target/release/agent-sandbox /usr/local/bin/agent-sandbox
USER user
WORKDIR /home/user
ENV ABX_SERVER_BASE_DIR=/home/user
# 9000: the HTTP API; 9001: the PTY WebSocket (terminal group).
EXPOSE 9000 9001
# The binary probes itself: the image needs no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/agent-sandbox", "--health-check"]
# Docker's default seccomp profile refuses io_uring; the server then falls back to epoll
# and says so. Run with --security-opt seccomp=<profile allowing io_uring> to keep it.
ENTRYPOINT ["/usr/local/bin/agent-sandbox"]
