# The tailrace binary in a small image (compose.yaml runs a cluster of it).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin tailrace

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tailrace /usr/local/bin/tailrace
ENTRYPOINT ["tailrace"]
