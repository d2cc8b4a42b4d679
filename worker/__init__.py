"""kp-scorer: scores ReasoningTrace documents flowing through Kafka (KnowledgePulse score).

The Python API (``from worker import TraceScorer``) is ``worker.api``; its names are
imported on first use, so ``import worker`` alone loads neither numpy nor the model.
"""

import os
from typing import TYPE_CHECKING, Any

from worker.version import __version__

# Set before numpy loads. The cache's matrix products are small ([1000, 384] x [384, 8]); with
# OpenBLAS's own thread pool competing against onnxruntime's threads they ran 10-25x slower
# (bench/cache_scan.py), so one BLAS thread is the default. An operator's value wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

if TYPE_CHECKING:
    from worker.api import (
        DeadLetter,
        Decision,
        Dimensions,
        NotRescored,
        Partition,
        ScoredTrace,
        ScoreResult,
        Settings,
        SettingsError,
        TraceInput,
        TraceScorer,
        load_settings,
        rescore_output,
    )

__all__ = [
    "DeadLetter",
    "Decision",
    "Dimensions",
    "NotRescored",
    "Partition",
    "ScoreResult",
    "ScoredTrace",
    "Settings",
    "SettingsError",
    "TraceInput",
    "TraceScorer",
    "__version__",
    "load_settings",
    "rescore_output",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from worker import api

        return getattr(api, name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
