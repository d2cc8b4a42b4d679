"""A producer's header whose name reads as one of the scorer's ``kp-`` names once Unicode is
normalised (NFKC, case folded) is dropped, and the scorer's own headers come first on every
output: a fullwidth ``ｋｐ-decision`` or ``kp‐decision`` (U+2010) was kept, before the scorer's
``kp-decision``, so a consumer that normalises names read the producer's verdict first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from worker.core.cache import PartitionCaches
from worker.core.output import refused, with_scorer_header, without_value
from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.core.rescoring import Rescored, Rescorer, rescored_record
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles

from support.traces import BUILTIN, trace_bytes

LOOK_ALIKES = [
    "ｋｐ-decision",  # fullwidth letters
    "ＫＰ－score",  # fullwidth capitals and hyphen-minus
    "kp\N{HYPHEN}decision",
    "kp\N{NON-BREAKING HYPHEN}decision",
    "kp\N{EN DASH}decision",
    "Kp\N{MINUS SIGN}score",
    "\N{ZERO WIDTH SPACE}kp-decision",
    "k\N{SOFT HYPHEN}p-decision",
]


class OnesEmbedder:
    """Every text the same vector: enough for an output that can be re-scored."""

    model_id = "ones"
    dimensions = 4

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.ones((len(texts), self.dimensions), dtype=np.float32)


PRODUCERS = [("trace", b"t"), ("kpx", b"1"), ("x-kp-decision", b"2"), ("café", None)]


def outputs(headers: tuple[tuple[str, bytes | None], ...]) -> list[RoutedRecord]:
    """Every form of output a record with these headers can take."""
    scorer = Scorer(
        load_profiles(None), Thresholds(), PartitionCaches(dimensions=4), OnesEmbedder()
    )
    values = [trace_bytes(), b"{not json", None]
    records = [SourceRecord("raw", 0, i, 1, b"k", v, headers) for i, v in enumerate(values)]
    routed = scorer.score_batch(records).routed
    assert [r.decision for r in routed] == [Decision.REJECTED, *[Decision.DEAD_LETTER] * 2]
    rescored = Rescorer(BUILTIN, 0.0).rescore_value(routed[0].value or b"")
    assert isinstance(rescored, Rescored)
    recorded = SourceRecord("kp.accepted", 0, 0, 1, b"k", routed[0].value, routed[0].headers)
    return [
        *routed,
        without_value(routed[0], 10),
        refused(routed[1], "too large"),
        with_scorer_header(routed[0], ("kp-timing-ms", b"{}")),
        rescored_record(recorded, rescored),
    ]


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_a_look_alike_of_a_kp_header_is_dropped_from_every_output(name: str) -> None:
    for routed in outputs(((name, b"accepted"), *PRODUCERS)):
        assert name not in [n for n, _ in routed.headers], routed.decision


def test_the_scorers_headers_come_first_then_the_producers_in_their_order() -> None:
    for routed in outputs(PRODUCERS):
        names = [name for name, _ in routed.headers]
        own = [name for name in names if name.startswith("kp-")]
        assert own and names[: len(own)] == own, names
        kept = routed.headers[len(own) :]
        assert kept in (tuple(PRODUCERS), ()), names  # the least dead letter keeps none
