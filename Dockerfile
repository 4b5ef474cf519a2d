# syntax=docker/dockerfile:1
#
# The `toolspan` binary (every subcommand: ingest, query, metrics, serve, demo, sql) in a slim
# Debian image. Built from the workspace root:  docker build -t toolspan .
# compose.yaml builds it once and runs each service from the same image.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---- build ----
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build

# rdkafka builds the bundled librdkafka (cmake, make, a C/C++ toolchain; zlib, SASL and
# OpenSSL for its optional features).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libsasl2-dev zlib1g-dev libzstd-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

# Cache mounts keep the registry and the target directory between builds; the binary is copied
# out because the target directory is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin toolspan \
 && install -m 0755 target/release/toolspan /usr/local/bin/toolspan

# ---- runtime ----
FROM debian:${DEBIAN_RELEASE}-slim

# curl for compose healthchecks; the rest are librdkafka's shared dependencies.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates curl libssl3 libsasl2-2 zlib1g libzstd1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin toolspan \
 && mkdir -p /data \
 && chown toolspan:toolspan /data

COPY --from=build /usr/local/bin/toolspan /usr/local/bin/toolspan

USER toolspan
WORKDIR /data
VOLUME ["/data"]
ENV TOOLSPAN_LOG=info

# 4318 OTLP/HTTP (serve), 8080 HTTP API and UI, 5433 Postgres wire, 9464 metrics job,
# 9465 ingest worker metrics.
EXPOSE 4318 8080 5433 9464 9465

ENTRYPOINT ["toolspan"]
CMD ["--help"]
