# syntax=docker/dockerfile:1
# Multi-stage image of the sidecar: a wheel is built in the first stage and installed into a
# slim, non-root runtime. The broker's log dirs are mounted read-only at run time.
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip install --no-cache-dir build==1.2.2 && python -m build --wheel --outdir /wheels

FROM python:3.11.11-slim-bookworm
RUN useradd --system --uid 10001 --home-dir /var/lib/kafka-tiered-sidecar --create-home sidecar
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENV SIDECAR_STATE_DIR=/var/lib/kafka-tiered-sidecar \
    SIDECAR_LOGGING__FORMAT=json
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=3s CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["sidecar"]
CMD ["run"]
