"""Sentence embeddings: texts to 384-d unit vectors with `tokenizers` and onnxruntime.

- ``protocol``: the :class:`Embedder` the scorer sees, and :class:`EmbedderUnavailable`.
- ``config``: :class:`EmbedderConfig`, the few settings the embedder reads.
- ``files``: which model file to load, the sha256 it must have, its sidecar.
- ``session``: the one factory of onnxruntime sessions (providers, options).
- ``encoder``: one batch through the model: tokenize, run, pool.
- ``pool``: :class:`OnnxEmbedder`, runs spread over a few threads sharing one model.
- ``load``: verify, open and smoke-test; :func:`load_embedder` falls back to no model.
- ``streamline``: exact rewrites of the model graph (less work, less memory).

Model files are built offline by `kp-scorer model build` (the int8 engine; the
``kp_model_build`` package, beside ``worker``): the worker only loads them.
"""

from worker.embedding.config import EmbedderConfig
from worker.embedding.load import load_embedder, open_embedder
from worker.embedding.pool import OnnxEmbedder
from worker.embedding.protocol import DIMENSIONS, Embedder, EmbedderUnavailable

__all__ = [
    "DIMENSIONS",
    "Embedder",
    "EmbedderConfig",
    "EmbedderUnavailable",
    "OnnxEmbedder",
    "load_embedder",
    "open_embedder",
]
