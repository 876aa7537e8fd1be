# sluice in a container: a multi-stage build, a small non-root runtime image.
#
#   docker build -t sluice .
#   docker run -p 6543:6543 -v sluice-data:/var/lib/sluice \
#     -v $PWD/sluice.toml:/etc/sluice/sluice.toml:ro sluice
#
# A container listens on 0.0.0.0, and sluice refuses to serve beyond loopback without users:
# mount a sluice.toml with [[users]] (verifiers from `sluice passwd`, see docs/config.md).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin sluice \
 && install -D target/release/sluice /out/sluice

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/sluice --shell /usr/sbin/nologin sluice \
 && mkdir -p /var/lib/sluice /etc/sluice \
 && chown sluice:sluice /var/lib/sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
USER sluice
VOLUME /var/lib/sluice
EXPOSE 6543
# SIGTERM drains: waiting queries fail with 57P01, running ones get server.shutdown_grace_ms.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/sluice.toml", "--listen", "0.0.0.0:6543", "--data-dir", "/var/lib/sluice"]
