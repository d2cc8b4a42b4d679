"""Content hashes of model files: what the embedder checks and the int8 cache is keyed by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path, what: str, error: type[Exception]) -> str:
    """Hash the file in chunks (models can be far larger than we want to hold twice); a
    missing or unreadable file raises ``error`` saying which ``what`` it was."""
    try:
        with path.open("rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc}") from None
