"""The scorer's version, which outputs carry and re-scoring compares: below every layer, so
any module may name it (``worker.__version__`` is the same string)."""

__version__ = "0.1.0"
