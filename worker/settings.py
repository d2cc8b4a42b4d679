"""The one settings object: every knob comes from the environment, validated at start-up.

Variables are prefixed ``KP_`` except the conventional ``KAFKA_BOOTSTRAP_SERVERS``.
``kp-scorer settings`` prints the effective values with secrets masked.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    PositiveFloat,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as SourceError

from worker.cores import usable_cores
from worker.logs import one_line

PACKAGE_DATA = Path(__file__).parent / "data"
DEFAULT_TOKENIZER_PATH = PACKAGE_DATA / "tokenizer.json"


class SettingsError(Exception):
    """Configuration is invalid; the message names each bad variable and why."""


# The variables ``load_settings(environ=...)`` reads instead of the process environment.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("kp_settings_environ", default=None)


class _MappingSource(EnvSettingsSource):
    """The environment source over a mapping: the same names, parsing and errors."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Settings are not case-sensitive: the source looks names up in lower case.
        return {name.lower(): value for name, value in self._environ.items()}


class Settings(BaseSettings):
    """Every setting, with its documented default. What each one means is written once, in
    ``docs/configuration_page.py`` (which generates docs/configuration.md)."""

    # No setting means anything at infinity (or NaN): `inf` would pass "> 0" and then stop
    # the start, or the first trace, where it meets an integer or a timer.
    model_config = SettingsConfigDict(
        env_prefix="KP_", frozen=True, extra="ignore", populate_by_name=True, allow_inf_nan=False
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        if environ is not None:  # load_settings(environ=...): that mapping, nothing else
            return init_settings, _MappingSource(settings_cls, environ)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    # Kafka
    kafka_bootstrap_servers: str = Field(
        default="localhost:9092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "KP_KAFKA_BOOTSTRAP_SERVERS"),
    )
    input_topic: str = "kp.traces.raw"
    accepted_topic: str = "kp.traces.accepted"
    rejected_topic: str = "kp.traces.rejected"
    dead_letter_topic: str = "kp.traces.dead-letter"
    group_id: str = "kp-scorer"
    # Apache Kafka refuses over 10,000 partitions in one CreateTopics request, and more copies
    # of a record than its brokers (3 is usual: over 16 is a typo, not a cluster).
    output_partitions: int | None = Field(default=None, gt=0, le=10_000)
    input_partitions: int = Field(default=4, gt=0, le=10_000)
    replication_factor: int = Field(default=1, gt=0, le=16)
    # Each holds its input and output (3 MiB at most by default); far fewer keep the runs busy.
    max_in_flight_records: int = Field(default=16, gt=0, le=10_000)
    fetch_max_wait_ms: int = Field(default=500, ge=0, le=10_000)
    fetch_buffer_records: int = Field(default=64, ge=8, le=100_000)
    # 6 s to 30 min, Apache Kafka's default group.min/max.session.timeout.ms: a broker refuses
    # a member outside them at its first join (INVALID_SESSION_TIMEOUT), after start-up.
    session_timeout_seconds: float = Field(default=10.0, ge=6, le=1800)
    heartbeat_interval_seconds: PositiveFloat = 1.0
    commit_interval_seconds: PositiveFloat = 1.0
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    # At most an hour: a stop needs seconds, and far more overflows the deadline's timer.
    shutdown_timeout_seconds: float = Field(default=20.0, gt=0, le=3600)
    log_repeat_interval_seconds: PositiveFloat = 10.0
    producer_idempotence: Literal["auto", "on", "off"] = "auto"
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None

    # Input limits
    input_framing: Literal["auto", "json", "confluent"] = "auto"
    # Kafka carries byte limits as 32-bit integers: a fetch asks for twice the largest input,
    # and the output topics' max.message.bytes is the largest output plus 64 KiB.
    max_message_bytes: int = Field(default=1_048_576, gt=0, le=1_073_741_823)
    # A million containers decode into ~100 MB in ~50 ms; 10,000 real steps hold under 30,000.
    max_json_containers: int = Field(default=131_072, gt=0, le=1_048_576)
    max_output_bytes: int = Field(default=2_097_152, gt=0, le=2_147_418_111)
    # A compressed batch is decompressed into one buffer this large (untouched pages cost no
    # memory): 4 GiB holds the largest output twice over; far more cannot be allocated.
    max_batch_bytes: int = Field(default=67_108_864, gt=0, le=4_294_967_296)

    # Scoring
    profiles_file: Path | None = None
    accept_threshold: float = Field(default=0.75, ge=0.0, le=1.0)
    # Decoded by _thresholds_json, which refuses a key given twice.
    domain_thresholds: Annotated[dict[str, float], NoDecode] = Field(default_factory=dict)

    # Novelty
    # At most 100,000 (100x the default): a partition taken over without its store embeds its
    # whole cache again (~30 min at 100,000); a cache reserves 8 bytes a slot at first use.
    cache_capacity: int = Field(default=1000, gt=0, le=100_000)
    # Whole milliseconds of event time: under 1 ms would round to no TTL at all.
    cache_ttl_seconds: float | None = Field(default=None, ge=0.001)
    cache_store_topic: str = "kp.traces.novelty-cache"  # empty: no store
    model_path: Path | None = None
    model_sha256: str | None = None
    tokenizer_path: Path = DEFAULT_TOKENIZER_PATH
    embedder_required: bool = False
    # More runs (or threads) than cores only wait, each run with its own buffers: hosts have far
    # under 1,024. A run of 1,024 texts of 512 tokens holds ~13 GB of attention scores a layer.
    embed_concurrency: int | None = Field(default=None, gt=0, le=1024)
    embed_threads: int = Field(default=1, gt=0, le=1024)
    embed_batch_size: int = Field(default=1, gt=0, le=1024)
    # At most 512, the model's position embeddings (the reference reads 512): the start-up
    # check embeds a text this long.
    embed_max_tokens: int = Field(default=256, gt=0, le=512)
    embed_providers: str = "CPUExecutionProvider"

    # Operations
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    health_stall_seconds: PositiveFloat = 60.0
    latency_budget_seconds: PositiveFloat = 0.1
    timing_header: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _servers_have_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port...], got {server.strip()!r}")
        return value

    @field_validator("log_level", "compression_type", mode="before")
    @classmethod
    def _any_case(cls, value: object, info: ValidationInfo) -> object:
        # People write `debug`, `Warning` or `LZ4` as often as `DEBUG` or `lz4`.
        if not isinstance(value, str):
            return value
        return value.strip().upper() if info.field_name == "log_level" else value.strip().lower()

    @field_validator("domain_thresholds", mode="before")
    @classmethod
    def _thresholds_json(cls, value: object) -> object:
        """The variable's JSON, a key given twice refused (:class:`RepeatedKeyError`)."""
        if not isinstance(value, str):
            return value
        try:
            decoded = json.loads(value, object_pairs_hook=unique_keys)
        except (ValueError, RecursionError):
            raise PydanticCustomError("json_invalid", "not a valid JSON value") from None
        except RepeatedKeyError as exc:
            raise PydanticCustomError(
                "duplicate_key", "key {key} appears twice", {"key": repr(exc.key)}
            ) from None
        return {} if decoded is None else decoded  # null: unset, as for any JSON variable

    @field_validator("domain_thresholds")
    @classmethod
    def _thresholds_in_range(cls, value: dict[str, float]) -> dict[str, float]:
        for domain, threshold in value.items():
            if not 0.0 <= threshold <= 1.0:
                raise ValueError(f"threshold for {domain!r} must be in [0, 1], got {threshold}")
        return value

    @field_validator("embed_providers")
    @classmethod
    def _providers_available(cls, value: str) -> str:
        # Each once, in the order given: onnxruntime warns of a repeated name on stderr.
        names = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
        if not names:
            raise ValueError("expected one or more onnxruntime provider names")
        import onnxruntime

        available = onnxruntime.get_available_providers()
        missing = [name for name in names if name not in available]
        if missing:
            raise ValueError(
                f"onnxruntime here has no {', '.join(missing)}; available: {', '.join(available)}"
            )
        return ",".join(names)

    @field_validator("model_sha256")
    @classmethod
    def _is_a_sha256(cls, value: str | None) -> str | None:
        # Malformed (a paste cut short, `sha256sum`'s whole line) would otherwise refuse the
        # model only once it is loaded, and the worker would score on with novelty 0.5.
        if value is None:
            return None
        digest = value.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"expected a sha256: 64 hexadecimal digits, got {value!r}")
        return digest

    @field_validator("model_path", "profiles_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("tokenizer_path")
    @classmethod
    def _is_a_tokenizer(cls, value: Path) -> Path:
        # Found only when the model loads, the worker would score on with novelty 0.5.
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(value))
        except Exception as exc:  # missing, unreadable, not a tokenizer's JSON
            raise ValueError(f"not a readable tokenizer file: {value}: {one_line(exc)}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        topics = [self.input_topic, self.accepted_topic, self.rejected_topic]
        topics += [self.dead_letter_topic, *filter(None, [self.cache_store_topic])]
        if len(set(topics)) != len(topics):
            raise ValueError(
                "KP_INPUT_TOPIC, KP_ACCEPTED_TOPIC, KP_REJECTED_TOPIC, KP_DEAD_LETTER_TOPIC "
                f"and KP_CACHE_STORE_TOPIC must all differ, got {topics}"
            )
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                "SASL security needs KP_SASL_MECHANISM, KP_SASL_USERNAME and KP_SASL_PASSWORD"
            )
        if self.max_output_bytes <= self.max_message_bytes:
            raise ValueError(
                "KP_MAX_OUTPUT_BYTES must exceed KP_MAX_MESSAGE_BYTES (outputs carry the input)"
            )
        if self.max_batch_bytes < self.output_record_limit:
            raise ValueError(
                "KP_MAX_BATCH_BYTES must be at least KP_MAX_OUTPUT_BYTES plus 64 KiB "
                f"({self.output_record_limit}): a batch holds at least one whole record"
            )
        if self.heartbeat_interval_seconds >= self.session_timeout_seconds:
            raise ValueError(
                "KP_HEARTBEAT_INTERVAL_SECONDS must be below KP_SESSION_TIMEOUT_SECONDS"
            )
        return self

    @property
    def fetch_max_bytes(self) -> int:
        """Bytes one fetch may bring, from one partition or from all together: room for the
        largest input twice. Kafka still returns a first batch larger than this whole (so a
        consumer always progresses); what bounds a batch then is the broker's
        ``message.max.bytes``, and its decompressed size is ``KP_MAX_BATCH_BYTES``
        (README, "Memory")."""
        return max(1_048_576, self.max_message_bytes * 2)

    @property
    def producer_compression(self) -> str | None:
        """``compression_type`` as the Kafka clients take it (None for no compression)."""
        return None if self.compression_type == "none" else self.compression_type

    @property
    def output_record_limit(self) -> int:
        """The largest output record with its headers and framing (producer and topic limit)."""
        return self.max_output_bytes + 65_536

    @property
    def embed_provider_names(self) -> tuple[str, ...]:
        return tuple(self.embed_providers.split(","))

    @cached_property
    def resolved_embed_concurrency(self) -> int:
        return self.embed_concurrency or usable_cores()


class RepeatedKeyError(Exception):
    """A JSON object gives one key twice: which one the operator meant is unknown."""

    def __init__(self, key: str) -> None:
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object_pairs_hook for operators' JSON, refusing a repeated key."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise RepeatedKeyError(key)
        seen.add(key)
    return dict(pairs)


def env_name(field: str) -> str:
    # Errors of an aliased field are located by the alias (the variable name) itself.
    if field.upper() in ("KAFKA_BOOTSTRAP_SERVERS", "KP_KAFKA_BOOTSTRAP_SERVERS"):
        return "KAFKA_BOOTSTRAP_SERVERS"
    return f"KP_{field.upper()}"


_BUILD_THE_MODEL = (
    "build the model once with `kp-scorer model build --int8 dynamic-per-channel -o FILE` "
    "and point KP_MODEL_PATH at FILE"
)
# Variables that were settings once, and what to do instead. The int8 engine used to be
# derived at run time into a cache directory; it is built offline now, so that the worker
# writes nothing to disk (a read-only root filesystem) and loads one checked file.
REMOVED_VARIABLES = {
    "KP_EMBED_ENGINE": f"removed: the int8 engine is no longer derived at start-up; "
    f"{_BUILD_THE_MODEL}",
    "KP_INT8_RECIPE": f"removed: the recipe is chosen when the model is built; {_BUILD_THE_MODEL}",
    "KP_MODEL_CACHE_DIR": f"removed: nothing is derived or cached at run time; {_BUILD_THE_MODEL}",
    "KP_EMBED_SPLIT_MIN_TOKENS": "removed: a lone long text runs like any other, one text per "
    "model thread (shorter tails, measured: docs/model.md); unset it",
}


# How close a ``KAFKA_*`` name must be to KAFKA_BOOTSTRAP_SERVERS to be taken for a misspelling
# of it: other ``KAFKA_*`` variables belong to other tools (KAFKA_HEAP_OPTS, KAFKA_OPTS...).
_KAFKA_TYPO_CUTOFF = 0.85


def known_variables() -> frozenset[str]:
    """Every ``KP_*`` variable a setting reads (KAFKA_BOOTSTRAP_SERVERS's alias included)."""
    return frozenset(f"KP_{name.upper()}" for name in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``KP_*`` variables no setting reads, each with the closest documented name if one is
    close, and ``KAFKA_*`` variables that look like a misspelt ``KAFKA_BOOTSTRAP_SERVERS``.

    Settings ignore such a variable, so a misspelt name would otherwise leave the default in
    force without a word (a worker dialling localhost:9092). Names compare
    case-insensitively, as settings read them.
    """
    known = known_variables() | REMOVED_VARIABLES.keys()  # removed ones stop start-up
    # A hint offers the names the README gives (never the KP_KAFKA_BOOTSTRAP_SERVERS alias).
    documented = [env_name(name) for name in Settings.model_fields]
    bootstrap = env_name("kafka_bootstrap_servers")
    unknown: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith("KP_") and upper not in known:
            close = difflib.get_close_matches(upper, documented, n=1)
            unknown.append((name, close[0] if close else None))
        elif (
            upper.startswith("KAFKA_")
            and upper != bootstrap
            and difflib.get_close_matches(upper, [bootstrap], n=1, cutoff=_KAFKA_TYPO_CUTOFF)
        ):
            unknown.append((name, bootstrap))
    return unknown


def by_variable(settings: Settings) -> dict[str, object]:
    """The effective values keyed by the variable that sets each: what an operator would
    export to get this configuration. A secret stays a SecretStr, printed as '**********'."""
    return {env_name(name): value for name, value in settings.model_dump().items()}


# What an optional setting left unset means, for `kp-scorer settings`.
UNSET_MEANS = {
    "KP_PROFILES_FILE": "built-in profiles",
    "KP_OUTPUT_PARTITIONS": "the input topic's count",
    "KP_CACHE_TTL_SECONDS": "no expiry",
}


def load_settings(
    flags: Mapping[str, str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    """Read and validate settings; a bad value raises SettingsError naming the variable.

    ``flags`` maps a setting given in ``overrides`` to the command-line flag it came from, so
    that an error names what the user typed (``--threshold``), not a variable they never set.
    ``environ`` is read instead of the process environment (the Python API's callers).
    """
    flags = flags or {}
    # A removed variable still set stops start-up with what to do instead.
    names = {name.upper() for name in (os.environ if environ is None else environ)}
    if removed := sorted(names & REMOVED_VARIABLES.keys()):
        lines = [f"{name}: {REMOVED_VARIABLES[name]}" for name in removed]
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines))
    token = _ENVIRON.set(environ)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except SourceError as exc:
        # The environment source could not even decode a value (e.g. a dict that is not JSON).
        found = re.search(r'field "(\w+)"', str(exc))
        name = env_name(found.group(1)) if found else "settings"
        raise SettingsError(f"invalid configuration:\n  {name}: not a valid JSON value") from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            name = (flags.get(field) or env_name(field)) if field else "settings"
            problems.append(f"{name}: {error['msg']}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
    finally:
        _ENVIRON.reset(token)
