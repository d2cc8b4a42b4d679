"""One batch of texts through the model: tokenize, run, pool.

Vectors must not depend on which other texts share a batch: a replay or a restarted worker
batches differently from the live run, and novelty may not change. The model's hidden states
for a text's real tokens are bit-identical whatever the padding (checked by the tests), and
pooling adds the padded positions last as exact zeros, so a vector is bit-identical alone or
in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

from worker.embedding.protocol import EmbedderUnavailable, FloatArray
from worker.logs import one_line

IntArray = npt.NDArray[np.int64]
Feeds = dict[str, IntArray]

# A text is tokenized from its first max_tokens * this many characters (16,384 at 256 tokens):
# tokenizing runs over all it is given before truncation keeps max_tokens, so a 1 MiB text
# would hold a model thread 0.25-0.9 s. Text runs ~4-5 characters a token (CJK one), so the cut
# changes no token of any text with fewer than 64 characters a token over its first max_tokens;
# the worst text at the cut tokenizes in ~13 ms (bench/tokenize_bound.py).
_CHARS_PER_TOKEN_CUT = 64


class Encoder:
    """The tokenizer and what the model is fed: token ids in, one unit vector per text out."""

    def __init__(
        self, tokenizer: Tokenizer, pad_id: int, max_tokens: int, input_names: Sequence[str]
    ) -> None:
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.char_cut = max_tokens * _CHARS_PER_TOKEN_CUT
        self._feeds_token_types = "token_type_ids" in input_names

    def encode(self, texts: Sequence[str]) -> list[Encoding]:
        """Token ids of each text's first ``max_tokens * 64`` characters.

        The batch encoder releases the interpreter lock while it works (``encode`` holds it),
        so the event loop keeps heartbeating while a long text is tokenized; skipping offsets
        makes it about a quarter faster.
        """
        cut = self.char_cut
        return self.tokenizer.encode_batch_fast([text[:cut] for text in texts])

    def feeds(self, encodings: list[Encoding], lengths: IntArray) -> Feeds:
        """The model's inputs for one batch, padded only to its own longest text."""
        width = int(lengths.max())
        input_ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : lengths[row]] = encoding.ids
        attention_mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
        return self.model_inputs(input_ids, attention_mask)

    def model_inputs(self, input_ids: IntArray, attention_mask: IntArray) -> Feeds:
        """The feeds for these ids: token types all 0, where the model takes them."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._feeds_token_types:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        return feeds


def load_tokenizer(path: Path, max_tokens: int) -> tuple[Tokenizer, int]:
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


def mean_pool_normalise(
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
