"""Offline model transforms: files derived from the model, written once and then loaded."""


class QuantizeError(Exception):
    """No int8 model could be derived or verified; str() is a one-line human reason."""
