"""Every ``kp_`` metric the worker exports, with its label names, read from the code.

``worker.stream.metrics`` defines them; an info metric's labels are the keys the observer
gives it (read here through a stand-in, so the process's own metrics are left as they are).
The operations page (``tests/unit/test_deploy.py``) and the label-cardinality guard
(``tests/unit/stream/test_metric_labels.py``) both read this list.
"""

from __future__ import annotations

from unittest import mock

from prometheus_client import REGISTRY, CollectorRegistry, Info
from prometheus_client.metrics import MetricWrapperBase

from worker.stream import metrics, observer

# A scraped family's name, as a scrape shows its series (a counter's samples end in _total).
_SUFFIX = {"counter": "_total", "info": "_info"}


def scraped_name(family_name: str, family_type: str) -> str:
    return family_name + _SUFFIX.get(family_type, "")


def _info_keys() -> dict[str, tuple[str, ...]]:
    """The keys the observer gives each info metric, as the worker reports them at start."""
    families = {
        name: value.describe()[0]
        for name, value in vars(metrics).items()
        if isinstance(value, Info)
    }
    stand_ins = {
        name: Info(family.name, family.documentation, registry=None)
        for name, family in families.items()
    }
    with mock.patch.object(observer, "metrics", mock.MagicMock(**stand_ins)):
        watcher = observer.MetricsObserver()
        watcher.configured("0.0.0", "a-model")
        watcher.embedder_loaded(None, "no model")
    keys = {}
    for name, stand_in in stand_ins.items():
        (family,) = stand_in.collect()
        (sample,) = family.samples
        assert sample.labels, f"{name}: no observer call above sets it; add the one that does"
        keys[sample.name] = tuple(sample.labels)
    return keys


def exported_metrics() -> dict[str, tuple[str, ...]]:
    """Each ``kp_`` metric by the name a scrape shows (``kp_records_total``), with its label
    names in the order the code gives them; checked against the process's registry, so a
    metric registered anywhere else would fail here."""
    found = _info_keys()
    for value in vars(metrics).values():
        if isinstance(value, Info):
            continue
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            # prometheus-client has no public reading of a metric's label names.
            found[scraped_name(family.name, family.type)] = tuple(value._labelnames)
        elif hasattr(value, "collect") and not isinstance(value, type | CollectorRegistry):
            for family in value.collect():  # a collector, computed when scraped
                found[family.name] = tuple(family._labelnames)  # type: ignore[attr-defined]
    registered = {
        scraped_name(family.name, family.type)
        for family in REGISTRY.collect()
        if family.name.startswith("kp_")
    }
    assert registered == set(found), (
        f"registered but not in worker.stream.metrics: {sorted(registered - set(found))}; "
        f"in worker.stream.metrics but not registered: {sorted(set(found) - registered)}"
    )
    return found
