# The tailrace binary in a small image (compose.yaml runs a cluster of it).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tailrace-server --bin tailrace

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/tailrace tailrace
COPY --from=build /src/target/release/tailrace /usr/local/bin/tailrace
USER tailrace
WORKDIR /var/lib/tailrace
# Ready: backends reachable, membership fresh, archiver not stuck, not
# stopping (docs/operations.md, "Probes"); the edge listens on 8585.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8585/readyz > /dev/null || exit 1
ENTRYPOINT ["tailrace"]
