# syntax=docker/dockerfile:1
# Build a static (musl) agent-sandbox, then ship it on a slim base that still has the
# tools sandbox callers expect (bash for /shell, git for the dev tools).

FROM rust:1-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin agent-sandbox \
 && strip target/x86_64-unknown-linux-musl/release/agent-sandbox

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --home-dir /home/user --shell /bin/bash user
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/agent-sandbox /usr/local/bin/agent-sandbox
USER user
WORKDIR /home/user
ENV ABX_SERVER_BASE_DIR=/home/user
# 9001 (the PTY WebSocket) joins when the terminal group is built.
EXPOSE 9000
# The binary probes itself: the image needs no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/agent-sandbox", "--health-check"]
# Docker's default seccomp profile refuses io_uring; the server then falls back to epoll
# and says so. Run with --security-opt seccomp=<profile allowing io_uring> to keep it.
ENTRYPOINT ["/usr/local/bin/agent-sandbox"]
