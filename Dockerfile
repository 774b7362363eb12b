# Build: docker build -t floodgate .
# Run:   docker run -p 8080:8080 floodgate
#        (the image's proxy.toml is the shipped one, the proxy listening on
#        all interfaces and the admin listener on the container's loopback
#        only; mount your own at /etc/floodgate/proxy.toml)

FROM rust:1-bookworm AS builder
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
# The manifest names the benches: Cargo reads their files for any build.
COPY benches ./benches
RUN cargo build --release --bin floodgate
# Inside a container the proxy must listen beyond loopback. The admin
# listener serves the health check, which runs inside the container: on
# loopback it answers that and nobody outside (to scrape /metrics, mount a
# config that binds it where only the scraper reaches, see docs/book/operating.md).
COPY proxy.toml ./proxy.toml
RUN sed -i 's/^listen = "127.0.0.1:8080"/listen = "0.0.0.0:8080"\nadmin_listen = "127.0.0.1:9091"/' proxy.toml \
 && ./target/release/floodgate check proxy.toml

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home floodgate
COPY --from=builder /src/target/release/floodgate /usr/local/bin/floodgate
COPY --from=builder /src/proxy.toml /etc/floodgate/proxy.toml
USER floodgate
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9091 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '200 OK' <&3"]
ENTRYPOINT ["floodgate"]
CMD ["--config", "/etc/floodgate/proxy.toml"]
