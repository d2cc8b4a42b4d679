"""``kp-scorer model build``: the model file the worker loads, derived once, offline.

Not part of the worker: only the command (``worker/cli/model.py``) imports it, when a model
is built, and nothing under ``worker`` does otherwise (tests/unit/core/test_core_imports.py).

- ``model_file``: :func:`build_model` writes the model and the sidecar the worker checks it by.
- ``int8``: the int8 engine, derived from the packaged model by onnxruntime's quantizer.
"""


class QuantizeError(Exception):
    """No model could be built or verified; str() is a one-line human reason."""
