"""The one place that builds onnxruntime sessions: execution providers and session options.

The worker, the model build and the benches all open their sessions through
:class:`SessionFactory` (or its options), so every run meets the same options.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from worker.embedding.config import CPU_PROVIDERS
from worker.embedding.streamline import streamline

_ARENA_GROW_AS_REQUESTED = 1  # onnxruntime's kSameAsRequested (0 is kNextPowerOfTwo)


@dataclass(frozen=True, slots=True)
class SessionFactory:
    """Sessions that run sequentially, without spinning: idle inference threads must not burn
    the cores the Kafka consumer and scorer share with them."""

    intra_op_threads: int = 1
    providers: tuple[str, ...] = CPU_PROVIDERS

    def options(self) -> ort.SessionOptions:
        """The session options the embedder runs with (the bench uses the same for its
        ceiling)."""
        _register_cpu_arena()
        options = ort.SessionOptions()
        options.add_session_config_entry("session.use_env_allocators", "1")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = self.intra_op_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: optimiser notices are noise in worker logs
        return options

    def open(self, model: str | bytes) -> ort.InferenceSession:
        """A session of ``model`` (a path or its bytes)."""
        return ort.InferenceSession(
            model, sess_options=self.options(), providers=list(self.providers)
        )


@functools.cache
def _register_cpu_arena() -> None:
    """One CPU memory arena for the process's sessions, grown by what a run asks for.

    onnxruntime's own arena grows in doubling chunks and keeps them: the worker's concurrent
    runs held 14-18 MiB more resident memory that way after the same texts, at the same speed
    and with bit-identical vectors (bench/RESULTS.md, memory).
    """
    ort.create_and_register_allocator(
        ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        ),
        ort.OrtArenaCfg({"arena_extend_strategy": _ARENA_GROW_AS_REQUESTED}),
    )


def streamlined_model(model_path: Path) -> str | bytes:
    """The model with the exact rewrites of :mod:`worker.embedding.streamline` applied (its
    bytes), or its path when none applies or the file cannot be read here (onnxruntime then
    loads it as it is, or says why it cannot)."""
    try:
        import onnx  # here, not at the top: 46 ms that commands without a model need not pay

        model = onnx.load(str(model_path))
        if not streamline(model).changed:
            return str(model_path)
        return model.SerializeToString()
    except Exception:  # unreadable, or too large to serialize: the model as it is is exact too
        return str(model_path)
