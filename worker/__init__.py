"""kp-scorer: scores ReasoningTrace documents flowing through Kafka (KnowledgePulse score)."""

import os

# Set before numpy loads. The cache's matrix products are small ([1000, 384] x [384, 8]); with
# OpenBLAS's own thread pool competing against onnxruntime's threads they ran 10-25x slower
# (bench/cache_scan.py), so one BLAS thread is the default. An operator's value wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
