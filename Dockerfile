# syntax=docker/dockerfile:1
# Image of the Kafka tiered-storage sidecar, carrying the broker plugin jar too.
#
#   docker build -t kafka-tiered-sidecar:0.1.0 .      (from a clean checkout; nothing to build first)
#   docker run --rm -v /var/lib/kafka/data:/var/lib/kafka/data:ro \
#     -e SIDECAR_KAFKA__BOOTSTRAP_SERVERS=broker:9092 -e SIDECAR_S3__BUCKET=tiered \
#     kafka-tiered-sidecar:0.1.0
#
# Two stages: `build` turns the source into a wheel and installs it with every dependency pinned
# into a virtualenv; the runtime stage copies only that virtualenv onto a slim Python. No compiler
# is needed (every dependency is installed from a wheel) and nothing runs as root at run time.
# A third stage builds the broker plugin (deploy/kafka-plugin, Java 17) with Maven and runs its
# JUnit tests; the runtime stage carries only the jar, at
# /opt/kafka-tiered-sidecar/plugin/kafka-tiered-sidecar-plugin.jar (the default path of
# `sidecar broker-config`; the Helm chart's init container copies it from there into the broker's
# pod). The broker's log dirs are mounted read-only. The daemon writes only to /var/lib, /var/cache
# and /run/kafka-tiered-sidecar, so the image also runs with a read-only root filesystem.

# The broker plugin: Kafka's RemoteStorageManager backed by the sidecar. Kafka's own jars are
# provided by the broker, so the jar holds only the plugin's classes. The POM is copied first so
# the dependency download stays cached while the sources change.
FROM maven:3.9.9-eclipse-temurin-17 AS plugin

WORKDIR /src/kafka-plugin
COPY deploy/kafka-plugin/pom.xml ./
RUN mvn -B -q -C -Dstyle.color=never dependency:go-offline
COPY deploy/kafka-plugin/src ./src
RUN mvn -B -q -C -Dstyle.color=never package


FROM python:3.11.14-slim-bookworm AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# The build backend, pinned (pyproject.toml asks for hatchling>=1.25).
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --only-binary=:all: \
        hatchling==1.33.0 \
        packaging==26.3 \
        pathspec==1.1.1 \
        pluggy==1.7.0 \
        tomlkit==0.15.2 \
        trove-classifiers==2026.9.21.13

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# Runtime dependencies: the complete resolved set, pinned exactly and installed without
# resolution (--no-deps); `pip check` fails the build if the set no longer satisfies the ranges in
# pyproject.toml. tests/deploy checks that every direct dependency has a pin here.
RUN python -m venv /opt/kafka-tiered-sidecar \
    && /opt/kafka-tiered-sidecar/bin/pip install --no-cache-dir --no-deps --only-binary=:all: \
        aiobotocore==3.10.0 \
        aiohappyeyeballs==2.7.1 \
        aiohttp==3.14.5 \
        aioitertools==0.13.0 \
        aiokafka==0.14.0 \
        aiosignal==1.4.0 \
        annotated-types==0.8.0 \
        async-timeout==5.0.1 \
        attrs==26.1.0 \
        botocore==1.43.117 \
        cramjam==2.14.0 \
        crc32c==2.9.post0 \
        frozenlist==1.8.0 \
        idna==3.20 \
        jmespath==1.1.0 \
        multidict==7.2.1 \
        packaging==26.3 \
        prometheus-client==0.26.0 \
        propcache==0.5.4 \
        pydantic==2.14.3 \
        pydantic-core==2.50.4 \
        python-dateutil==2.9.0.post0 \
        six==1.17.0 \
        structlog==26.1.0 \
        typing-extensions==4.16.0 \
        typing-inspection==0.4.5 \
        urllib3==2.8.0 \
        uvloop==0.23.0 \
        watchdog==7.1.0 \
        wrapt==2.5.2 \
        yarl==1.25.1 \
    && /opt/kafka-tiered-sidecar/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
    && /opt/kafka-tiered-sidecar/bin/pip check \
    && /opt/kafka-tiered-sidecar/bin/pip uninstall --yes pip setuptools


FROM python:3.11.14-slim-bookworm

LABEL org.opencontainers.image.title="kafka-tiered-sidecar" \
      org.opencontainers.image.description="Tiered-storage sidecar for Apache Kafka: uploads rolled segments to S3 and publishes KIP-405 metadata" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric UID/GID, so Kubernetes' runAsNonRoot can verify it and volumes can be chowned.
# The image's default config binds the metrics port on all interfaces (a container's loopback
# is not reachable by Prometheus or the kubelet); mount your own file over it or use SIDECAR_*.
RUN groupadd --system --gid 10001 sidecar \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/kafka-tiered-sidecar --shell /usr/sbin/nologin sidecar \
    && install -d -o 10001 -g 10001 -m 0750 \
        /var/lib/kafka-tiered-sidecar /var/cache/kafka-tiered-sidecar /run/kafka-tiered-sidecar \
    && install -d -m 0755 /etc/kafka-tiered-sidecar \
    && printf '%s\n' \
        '# Defaults of the container image; SIDECAR_* variables and --set override them.' \
        'state_dir = "/var/lib/kafka-tiered-sidecar"' \
        '[read_server]' \
        'socket_path = "/run/kafka-tiered-sidecar/read.sock"' \
        'cache_dir = "/var/cache/kafka-tiered-sidecar"' \
        '[metrics]' \
        'host = "0.0.0.0"' \
        'port = 9464' \
        '[logging]' \
        'format = "json"' \
        > /etc/kafka-tiered-sidecar/sidecar.toml

COPY --from=build /opt/kafka-tiered-sidecar /opt/kafka-tiered-sidecar
COPY --from=plugin /src/kafka-plugin/target/kafka-tiered-sidecar-plugin.jar \
    /opt/kafka-tiered-sidecar/plugin/kafka-tiered-sidecar-plugin.jar

ENV PATH=/opt/kafka-tiered-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

USER 10001:10001
WORKDIR /var/lib/kafka-tiered-sidecar
EXPOSE 9464
# SIGTERM drains uploads in flight (tiering.drain_timeout_s); give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
# /healthz answers while the process is alive; set SIDECAR_METRICS__PORT if you move the port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('SIDECAR_METRICS__PORT', '9464'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["sidecar"]
CMD ["run", "--config", "/etc/kafka-tiered-sidecar/sidecar.toml"]
