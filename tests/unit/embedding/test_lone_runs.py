"""A long text that arrives alone runs on every core, with the same bits as on one.

The lone-run session is the same model with one intra-op thread per core (onnxruntime's own
parallelism). Novelty, replays and the golden vectors depend on a text's vector never
depending on whether it arrived alone, so the embedder keeps that session only when its
vectors are the single-threaded session's bits, and uses it only while nothing else runs
or waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from worker.embedding import EmbedderConfig, OnnxEmbedder, open_embedder
from worker.embedding.session import SessionFactory

# fmt: off
WORDS = [
    "agent", "tool", "call", "result", "error", "again", "delay", "database", "query", "user",
    "money", "order", "policy", "search", "answer", "plan", "step", "check", "value", "cache",
]
# fmt: on
SPLIT_MIN_TOKENS = 64


def text(words: int, seed: int) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=words))


def load(split_min_tokens: int, concurrency: int = 2) -> OnnxEmbedder:
    return open_embedder(EmbedderConfig(concurrency=concurrency, split_min_tokens=split_min_tokens))


class CountingSession:
    """A session that counts its runs and can hold each run until released."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.runs = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        self.started.set()
        self.release.wait(10)
        return self.session.run(*args, **kwargs)


@pytest.fixture(scope="module")
def whole() -> Iterator[OnnxEmbedder]:
    embedder = load(split_min_tokens=0)
    yield embedder
    embedder.close()


@pytest.fixture
def lone() -> Iterator[OnnxEmbedder]:
    embedder = load(split_min_tokens=SPLIT_MIN_TOKENS)
    yield embedder
    embedder.close()


def test_the_packaged_model_gets_a_lone_run_session(
    lone: OnnxEmbedder, whole: OnnxEmbedder
) -> None:
    assert lone.lone_model is not None and lone.split_note is None
    assert whole.lone_model is None
    assert whole.split_note is not None and "not split" in whole.split_note
    one_thread = load(split_min_tokens=SPLIT_MIN_TOKENS, concurrency=1)
    assert one_thread.lone_model is None
    one_thread.close()


@pytest.mark.parametrize("words", [3, 40, 120, 255, 400])
def test_a_lone_run_gives_the_single_threaded_bits(
    lone: OnnxEmbedder, whole: OnnxEmbedder, words: int
) -> None:
    sample = text(words, words)
    assert np.array_equal(lone.submit([sample]).result(), whole.submit([sample]).result())


def test_only_a_long_run_with_the_cores_to_itself_takes_them(lone: OnnxEmbedder) -> None:
    assert lone.lone_model is not None
    one, every = CountingSession(lone.model), CountingSession(lone.lone_model)
    lone.model, lone.lone_model = one, every  # type: ignore[assignment]
    split_before = lone.runs_split
    lone.submit([text(200, 6)]).result()
    assert (one.runs, every.runs, lone.runs_split - split_before) == (0, 1, 1)
    lone.submit([text(20, 7)]).result()  # under KP_EMBED_SPLIT_MIN_TOKENS
    assert (one.runs, every.runs) == (1, 1)
    # Another text is running: the long one stays on one core.
    one.release.clear()
    one.started.clear()
    held = lone.submit([text(20, 8)])
    assert one.started.wait(10)
    long_meanwhile = lone.submit([text(200, 9)])
    one.release.set()
    held.result()
    long_meanwhile.result()
    assert (one.runs, every.runs, lone.runs_split - split_before) == (3, 1, 1)


def test_a_backlog_runs_one_text_per_core(lone: OnnxEmbedder) -> None:
    assert lone.lone_model is not None
    every = CountingSession(lone.lone_model)
    lone.lone_model = every  # type: ignore[assignment]
    lone.embed([text(200, seed) for seed in range(6)])
    # Of six, at most the first (before the rest are handed over) and the last (the other
    # core free again) can find nothing else running.
    assert every.runs <= 2


def test_a_session_whose_threads_change_the_bits_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where more intra-op threads would change a vector (another provider, another build),
    runs stay on one core and the reason is kept."""
    real_open = SessionFactory.open

    def open_off_by_one_ulp(factory: SessionFactory, *args: Any, **kwargs: Any) -> Any:
        session = real_open(factory, *args, **kwargs)
        if factory.intra_op_threads == 1:
            return session

        class OffByOneUlp:
            def __getattr__(self, name: str) -> Any:
                return getattr(session, name)

            def run(self, *run_args: Any, **run_kwargs: Any) -> Any:
                return [np.nextafter(out, np.inf) for out in session.run(*run_args, **run_kwargs)]

        return OffByOneUlp()

    monkeypatch.setattr(SessionFactory, "open", open_off_by_one_ulp)
    embedder = load(split_min_tokens=SPLIT_MIN_TOKENS)
    assert embedder.lone_model is None
    assert embedder.split_note == "runs are not split: 2 intra-op threads change the vectors' bits"
    embedder.close()
