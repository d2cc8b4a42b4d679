"""Configuration errors, SASL/SSL pass-through, secret masking, and no trace contents in logs.

- Every invalid setting stops ``kp-scorer worker`` and ``kp-scorer settings`` with exit code 2
  and one error on stderr that names the variable: no traceback, nothing started.
- SASL and SSL settings reach every Kafka client (aiokafka and Faust), and ``settings``
  prints the password masked.
- A worker at INFO never writes a trace's contents to its log: a broker test,
  ``tests/broker/test_config_security_broker.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from worker.io.kafka import client_config
from worker.settings import SettingsError, by_variable, load_settings

from support.tls import handshake, make_broker_certificates

PASSWORD = "pw-" + uuid.uuid4().hex
COMMAND_TIMEOUT_SECONDS = 60


def _ca_file() -> Path | None:
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        found = ssl.get_default_verify_paths().cafile
        return Path(found) if found else None


CA_FILE = _ca_file()


def _clean_env(**env: str) -> dict[str, str]:
    """The parent's environment without any kp-scorer settings, plus ``env``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KP_") and k != "KAFKA_BOOTSTRAP_SERVERS"
    }
    return {**base, "PYTHONUNBUFFERED": "1", **env}


def run_cli(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", command],
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        stdin=subprocess.DEVNULL,
    )


# -- invalid settings -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiles_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("profiles")
    files = {
        "sum_not_one": {
            "default": {"complexity": 0.5, "novelty": 0.5, "tool_diversity": 0.5, "outcome": 0.5}
        },
        "no_default": {
            "code": {"complexity": 0.25, "novelty": 0.25, "tool_diversity": 0.25, "outcome": 0.25}
        },
        "missing_weight": {"default": {"complexity": 0.5, "novelty": 0.5}},
    }
    out = {}
    for name, content in files.items():
        out[name] = folder / f"{name}.json"
        out[name].write_bytes(orjson.dumps(content))
    out["not_json"] = folder / "not_json.json"
    out["not_json"].write_text("default: {complexity: 1}")
    out["duplicate_profile"] = folder / "duplicate_profile.json"
    out["duplicate_profile"].write_text(
        '{"default": {"complexity": 0.25, "novelty": 0.35, "tool_diversity": 0.15, "outcome": '
        '0.25}, "default": {"complexity": 1, "novelty": 0, "tool_diversity": 0, "outcome": 0}}'
    )
    return out


# name -> (environment, the variable the error must name)
BAD_SETTINGS: dict[str, tuple[dict[str, str], str]] = {
    "threshold_above_1": ({"KP_ACCEPT_THRESHOLD": "2"}, "KP_ACCEPT_THRESHOLD"),
    "threshold_not_a_number": ({"KP_ACCEPT_THRESHOLD": "high"}, "KP_ACCEPT_THRESHOLD"),
    "in_flight_zero": ({"KP_MAX_IN_FLIGHT_RECORDS": "0"}, "KP_MAX_IN_FLIGHT_RECORDS"),
    "fetch_wait_negative": ({"KP_FETCH_MAX_WAIT_MS": "-1"}, "KP_FETCH_MAX_WAIT_MS"),
    "concurrency_zero": ({"KP_EMBED_CONCURRENCY": "0"}, "KP_EMBED_CONCURRENCY"),
    "bootstrap_without_port": (
        {"KAFKA_BOOTSTRAP_SERVERS": "nohostport"},
        "KAFKA_BOOTSTRAP_SERVERS",
    ),
    "bootstrap_bad_second_server": (
        {"KAFKA_BOOTSTRAP_SERVERS": "localhost:9092,broker2"},
        "KAFKA_BOOTSTRAP_SERVERS",
    ),
    "profiles_file_missing": ({"KP_PROFILES_FILE": "/nonexistent/p.json"}, "KP_PROFILES_FILE"),
    "profiles_sum_not_one": ({"KP_PROFILES_FILE": "@sum_not_one"}, "KP_PROFILES_FILE"),
    "profiles_no_default": ({"KP_PROFILES_FILE": "@no_default"}, "KP_PROFILES_FILE"),
    "profiles_missing_weight": ({"KP_PROFILES_FILE": "@missing_weight"}, "KP_PROFILES_FILE"),
    "profiles_not_json": ({"KP_PROFILES_FILE": "@not_json"}, "KP_PROFILES_FILE"),
    "profiles_duplicate_profile": ({"KP_PROFILES_FILE": "@duplicate_profile"}, "KP_PROFILES_FILE"),
    "sasl_ssl_without_credentials": ({"KP_SECURITY_PROTOCOL": "SASL_SSL"}, "KP_SASL_PASSWORD"),
    "sasl_without_password": (
        {
            "KP_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KP_SASL_MECHANISM": "PLAIN",
            "KP_SASL_USERNAME": "alice",
        },
        "KP_SASL_PASSWORD",
    ),
    "security_protocol_unknown": ({"KP_SECURITY_PROTOCOL": "TLS"}, "KP_SECURITY_PROTOCOL"),
    "sasl_mechanism_unknown": ({"KP_SASL_MECHANISM": "GSSAPI"}, "KP_SASL_MECHANISM"),
    "ssl_cafile_missing": ({"KP_SSL_CAFILE": "/nonexistent/ca.pem"}, "KP_SSL_CAFILE"),
    # Loaded only by the first Kafka client before: "SSLError: [SSL] PEM lib", exit 1.
    "ssl_cafile_not_certificates": (
        {"KP_SECURITY_PROTOCOL": "SSL", "KP_SSL_CAFILE": "@not_json"},
        "KP_SSL_CAFILE",
    ),
    "ssl_certfile_not_a_certificate": (
        {"KP_SECURITY_PROTOCOL": "SASL_SSL", "KP_SSL_CERTFILE": "@not_json"}
        | {"KP_SASL_MECHANISM": "PLAIN", "KP_SASL_USERNAME": "a", "KP_SASL_PASSWORD": "p"},
        "KP_SSL_CERTFILE",
    ),
    "input_equals_accepted": (
        {"KP_INPUT_TOPIC": "same", "KP_ACCEPTED_TOPIC": "same"},
        "KP_INPUT_TOPIC",
    ),
    "rejected_equals_dead_letter": (
        {"KP_REJECTED_TOPIC": "same", "KP_DEAD_LETTER_TOPIC": "same"},
        "KP_DEAD_LETTER_TOPIC",
    ),
    "domain_threshold_above_1": ({"KP_DOMAIN_THRESHOLDS": '{"x": 3}'}, "KP_DOMAIN_THRESHOLDS"),
    "domain_thresholds_not_json": ({"KP_DOMAIN_THRESHOLDS": "x=0.5"}, "KP_DOMAIN_THRESHOLDS"),
    "domain_thresholds_array": ({"KP_DOMAIN_THRESHOLDS": "[0.5]"}, "KP_DOMAIN_THRESHOLDS"),
    "domain_thresholds_key_twice": (
        {"KP_DOMAIN_THRESHOLDS": '{"code": 0.2, "code": 0.9}'},
        "KP_DOMAIN_THRESHOLDS",
    ),
    "log_level_unknown": ({"KP_LOG_LEVEL": "LOUD"}, "KP_LOG_LEVEL"),
    "metrics_port_out_of_range": ({"KP_METRICS_PORT": "70000"}, "KP_METRICS_PORT"),
    "cache_capacity_negative": ({"KP_CACHE_CAPACITY": "-1"}, "KP_CACHE_CAPACITY"),
    "cache_ttl_zero": ({"KP_CACHE_TTL_SECONDS": "0"}, "KP_CACHE_TTL_SECONDS"),
    # Under a millisecond rounds to a TTL of 0 ms, which the first record's cache refused.
    "cache_ttl_below_a_millisecond": ({"KP_CACHE_TTL_SECONDS": "0.0001"}, "KP_CACHE_TTL_SECONDS"),
    "cache_ttl_infinite": ({"KP_CACHE_TTL_SECONDS": "inf"}, "KP_CACHE_TTL_SECONDS"),
    "session_timeout_infinite": (
        {"KP_SESSION_TIMEOUT_SECONDS": "inf"},
        "KP_SESSION_TIMEOUT_SECONDS",
    ),
    "shutdown_timeout_infinite": (
        {"KP_SHUTDOWN_TIMEOUT_SECONDS": "Infinity"},
        "KP_SHUTDOWN_TIMEOUT_SECONDS",
    ),
    # Beyond what the deadline's timer can wait: it would die at the first SIGTERM, unfired.
    "shutdown_timeout_beyond_the_timer": (
        {"KP_SHUTDOWN_TIMEOUT_SECONDS": "1e10"},
        "KP_SHUTDOWN_TIMEOUT_SECONDS",
    ),
    # 800 MB reserved by each partition's cache at its first record.
    "cache_capacity_huge": ({"KP_CACHE_CAPACITY": "100000000"}, "KP_CACHE_CAPACITY"),
    # Longer than the model's 512 position embeddings (10**9 built a 2 GB test text).
    "embed_max_tokens_beyond_the_model": ({"KP_EMBED_MAX_TOKENS": "513"}, "KP_EMBED_MAX_TOKENS"),
    "max_message_bytes_text": ({"KP_MAX_MESSAGE_BYTES": "1MB"}, "KP_MAX_MESSAGE_BYTES"),
    # Each valid before it was bounded: a fetch of twice 1 GiB does not fit Kafka's 32-bit
    # request field, nor does the largest output plus 64 KiB in the topics' max.message.bytes,
    # and every compressed batch would need a buffer of 1 TiB.
    "max_message_bytes_beyond_a_fetch": (
        {
            "KP_MAX_MESSAGE_BYTES": "1073741824",
            "KP_MAX_OUTPUT_BYTES": "1073741825",
            "KP_MAX_BATCH_BYTES": "2147483648",
        },
        "KP_MAX_MESSAGE_BYTES",
    ),
    "max_output_bytes_beyond_kafka": (
        {"KP_MAX_OUTPUT_BYTES": "2147418112", "KP_MAX_BATCH_BYTES": "4294967296"},
        "KP_MAX_OUTPUT_BYTES",
    ),
    "max_batch_bytes_beyond_memory": (
        {"KP_MAX_BATCH_BYTES": "1099511627776"},
        "KP_MAX_BATCH_BYTES",
    ),
    # Each valid before it was bounded: a million model threads, a topic of ten million
    # partitions (a broker refuses over 10,000 a request), 40,000 copies of each record.
    "embed_concurrency_huge": ({"KP_EMBED_CONCURRENCY": "1000000"}, "KP_EMBED_CONCURRENCY"),
    "in_flight_huge": ({"KP_MAX_IN_FLIGHT_RECORDS": "1000000000"}, "KP_MAX_IN_FLIGHT_RECORDS"),
    "input_partitions_huge": ({"KP_INPUT_PARTITIONS": "10000000"}, "KP_INPUT_PARTITIONS"),
    "output_partitions_huge": ({"KP_OUTPUT_PARTITIONS": "10001"}, "KP_OUTPUT_PARTITIONS"),
    "replication_factor_huge": ({"KP_REPLICATION_FACTOR": "40000"}, "KP_REPLICATION_FACTOR"),
    # Also valid before: 100,000 intra-op threads a run (`score` crashed at start-up in 8 GB of
    # memory), runs of ten million texts, more JSON containers a record than 100 MB of objects.
    "embed_threads_huge": ({"KP_EMBED_THREADS": "100000"}, "KP_EMBED_THREADS"),
    "embed_batch_size_huge": ({"KP_EMBED_BATCH_SIZE": "10000000"}, "KP_EMBED_BATCH_SIZE"),
    "json_containers_huge": ({"KP_MAX_JSON_CONTAINERS": "1048577"}, "KP_MAX_JSON_CONTAINERS"),
    "embedder_required_not_bool": ({"KP_EMBEDDER_REQUIRED": "maybe"}, "KP_EMBEDDER_REQUIRED"),
    "model_path_missing": ({"KP_MODEL_PATH": "/nonexistent/model.onnx"}, "KP_MODEL_PATH"),
    # Each loaded only with the model before: the worker scored on with novelty 0.5.
    "tokenizer_path_missing": (
        {"KP_TOKENIZER_PATH": "/nonexistent/tokenizer.json"},
        "KP_TOKENIZER_PATH",
    ),
    "tokenizer_path_not_json": ({"KP_TOKENIZER_PATH": "@not_json"}, "KP_TOKENIZER_PATH"),
    "tokenizer_path_not_a_tokenizer": ({"KP_TOKENIZER_PATH": "@sum_not_one"}, "KP_TOKENIZER_PATH"),
    "heartbeat_not_below_session": (
        {"KP_SESSION_TIMEOUT_SECONDS": "6", "KP_HEARTBEAT_INTERVAL_SECONDS": "6"},
        "KP_HEARTBEAT_INTERVAL_SECONDS",
    ),
    # Outside what an Apache Kafka broker accepts by default: refused at the first join.
    "session_timeout_below_the_brokers_minimum": (
        {"KP_SESSION_TIMEOUT_SECONDS": "5.9"},
        "KP_SESSION_TIMEOUT_SECONDS",
    ),
    "session_timeout_above_the_brokers_maximum": (
        {"KP_SESSION_TIMEOUT_SECONDS": "1801"},
        "KP_SESSION_TIMEOUT_SECONDS",
    ),
}
COMMANDS = ("worker", "settings")
# Also run as real processes (the rest in-process: the same code, much faster).
SUBPROCESS_CASES = (
    "threshold_above_1",
    "bootstrap_without_port",
    "profiles_sum_not_one",
    "sasl_ssl_without_credentials",
    "input_equals_accepted",
    "domain_threshold_above_1",
    "domain_thresholds_not_json",
    "log_level_unknown",
)


def _env_for(case: str, profiles_files: dict[str, Path]) -> dict[str, str]:
    env = dict(BAD_SETTINGS[case][0])
    for key, value in env.items():
        if value.startswith("@"):
            env[key] = str(profiles_files[value[1:]])
    # A worker that wrongly accepted its settings must not find a broker.
    env.setdefault("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    return env


@pytest.fixture(scope="module")
def cli_results(profiles_files: dict[str, Path]) -> dict[tuple[str, str], object]:
    """The subprocess cases through both commands, in parallel (each a fresh interpreter)."""
    jobs = [(case, command) for case in SUBPROCESS_CASES for command in COMMANDS]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(
            zip(
                jobs,
                pool.map(lambda job: _run_timed(job[1], _env_for(job[0], profiles_files)), jobs),
                strict=True,
            )
        )
    print(
        f"\n{len(jobs)} bad-configuration processes in {time.monotonic() - started:.1f} s "
        f"(slowest {max(r[1] for r in results.values()):.1f} s)"
    )
    return results


def _run_timed(command: str, env: dict[str, str]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        result: object = run_cli(command, **env)
    except subprocess.TimeoutExpired as exc:
        result = exc
    return result, time.monotonic() - started


def _names(text: str, variable: str) -> bool:
    """``variable`` appears as a whole name (KAFKA_BOOTSTRAP_SERVERS is not KP_KAFKA_...)."""
    return re.search(rf"(?<![A-Z_]){re.escape(variable)}(?![A-Z_])", text) is not None


def _assert_one_clear_error(code: object, stdout: str, stderr: str, variable: str) -> None:
    assert code == 2, f"exit {code}; stderr:\n{stderr[-2000:]}"
    assert "Traceback" not in stderr + stdout, stderr[-2000:]
    assert _names(stderr, variable), f"error does not name {variable}:\n{stderr}"
    assert stderr.count("kp-scorer:") == 1, f"one error, not several:\n{stderr}"
    assert stdout == "", "nothing printed, nothing started"


class _WorkerStarted(Exception):
    pass


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(BAD_SETTINGS))
def test_bad_setting_is_one_clear_startup_error(
    case: str,
    command: str,
    profiles_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In-process ``kp-scorer <command>`` (the CLI's own main) with the bad environment."""
    from worker.cli import main as cli
    from worker.io import app

    for name in [k for k in os.environ if k.startswith("KP_") or k == "KAFKA_BOOTSTRAP_SERVERS"]:
        monkeypatch.delenv(name)
    for name, value in _env_for(case, profiles_files).items():
        monkeypatch.setenv(name, value)

    def started(*args: object, **kwargs: object) -> None:
        raise _WorkerStarted

    monkeypatch.setattr(app, "create_app", started)  # never run a worker here
    try:
        code: object = cli.main([command])
    except SystemExit as exited:
        code = exited.code
    captured = capsys.readouterr()
    _assert_one_clear_error(code, captured.out, captured.err, BAD_SETTINGS[case][1])
    if command == "worker":
        print(f"\n{case}: {' '.join(captured.err.split())[:200]}")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_setting_stops_the_real_command(cli_results, case: str, command: str) -> None:
    result, _ = cli_results[(case, command)]
    assert isinstance(result, subprocess.CompletedProcess), (
        f"`kp-scorer {command}` did not exit within {COMMAND_TIMEOUT_SECONDS} s"
    )
    _assert_one_clear_error(result.returncode, result.stdout, result.stderr, BAD_SETTINGS[case][1])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('{"code": 0.2, "code": 0.9}', "key 'code' appears twice"),
        ('{"code": 0.2, "medical": 0.5, "code": 0.2}', "key 'code' appears twice"),
        ("[" * 100_000, "not a valid JSON value"),
    ],
)
def test_domain_thresholds_json_is_refused_in_one_clear_line(value: str, problem: str) -> None:
    """A JSON decoder keeps the last of two equal keys: which threshold was meant is unknown.
    JSON nested past the decoder's depth is not a threshold either (not a traceback)."""
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={"KP_DOMAIN_THRESHOLDS": value})
    assert str(refused.value) == f"invalid configuration:\n  KP_DOMAIN_THRESHOLDS: {problem}"


# The byte limits at their bounds, each with the others it must fit.
_LARGEST_BYTES = {
    "KP_MAX_MESSAGE_BYTES": "1073741823",
    "KP_MAX_OUTPUT_BYTES": "2147418111",
    "KP_MAX_BATCH_BYTES": "4294967296",
}


@pytest.mark.parametrize(
    "environ",
    [
        {"KP_SHUTDOWN_TIMEOUT_SECONDS": "3600"},
        {"KP_CACHE_CAPACITY": "100000"},
        {"KP_EMBED_MAX_TOKENS": "512"},
        {"KP_SESSION_TIMEOUT_SECONDS": "1800"},
        {"KP_SESSION_TIMEOUT_SECONDS": "6"},
        _LARGEST_BYTES,
        {
            "KP_EMBED_CONCURRENCY": "1024",
            "KP_MAX_IN_FLIGHT_RECORDS": "10000",
            "KP_INPUT_PARTITIONS": "10000",
            "KP_OUTPUT_PARTITIONS": "10000",
            "KP_REPLICATION_FACTOR": "16",
        },
        {"KP_EMBED_THREADS": "1024", "KP_EMBED_BATCH_SIZE": "1024"},
        {"KP_MAX_JSON_CONTAINERS": "1048576"},
    ],
    ids=lambda environ: ",".join(environ),
)
def test_settings_at_their_bounds_are_accepted(
    isolated_settings: None, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]
) -> None:
    for variable, value in environ.items():
        monkeypatch.setenv(variable, value)
    effective = by_variable(load_settings())
    assert {variable: effective[variable] for variable in environ} == {
        variable: float(value) for variable, value in environ.items()
    }


def test_valid_settings_print_and_exit_zero() -> None:
    result = run_cli("settings", KP_ACCEPT_THRESHOLD="0.6", KP_DOMAIN_THRESHOLDS='{"code": 0.8}')
    assert result.returncode == 0, result.stderr
    assert "KP_ACCEPT_THRESHOLD = 0.6" in result.stdout
    assert "'code': 0.8" in result.stdout


# -- SASL / SSL pass-through and masking ------------------------------------------------------


@pytest.fixture(scope="module")
def client_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a client certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "client.pem", folder / "client.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=kp-scorer-test", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.mark.skipif(CA_FILE is None, reason="no CA bundle on this machine")
def test_sasl_ssl_settings_reach_the_kafka_clients() -> None:
    settings = load_settings(
        kafka_bootstrap_servers="broker.example:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alice",
        sasl_password=PASSWORD,
        ssl_cafile=CA_FILE,
    )
    config = client_config(settings)
    assert config["bootstrap_servers"] == "broker.example:9093"
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["sasl_plain_username"] == "alice"
    assert config["sasl_plain_password"] == PASSWORD
    context = config["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0, "the CA file was loaded"

    # The group consumer gets the same.
    from worker.io.group_consumer import group_consumer_config

    group = group_consumer_config(settings)
    assert isinstance(group.pop("ssl_context"), ssl.SSLContext)
    assert {key: group[key] for key in config if key != "ssl_context"} == {
        key: value for key, value in config.items() if key != "ssl_context"
    }
    print(
        f"\nSASL_SSL: client_config keys {sorted(config)}; "
        f"CA certificates loaded: {context.cert_store_stats()['x509_ca']}"
    )


def test_sasl_plaintext_has_no_ssl_context() -> None:
    settings = load_settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="bob",
        sasl_password=PASSWORD,
    )
    config = client_config(settings)
    assert config["security_protocol"] == "SASL_PLAINTEXT"
    assert (config["sasl_mechanism"], config["sasl_plain_username"]) == ("PLAIN", "bob")
    assert config["sasl_plain_password"] == PASSWORD
    assert "ssl_context" not in config


def test_ssl_with_client_certificate(client_cert: tuple[Path, Path]) -> None:
    cert, key = client_cert
    settings = load_settings(
        security_protocol="SSL", ssl_cafile=cert, ssl_certfile=cert, ssl_keyfile=key
    )
    config = client_config(settings)
    assert config["security_protocol"] == "SSL"
    assert isinstance(config["ssl_context"], ssl.SSLContext)
    assert not any(k.startswith("sasl") for k in config)

    from worker.io.group_consumer import group_consumer_config

    assert group_consumer_config(settings)["security_protocol"] == "SSL"


@pytest.mark.parametrize("command", COMMANDS)
def test_an_encrypted_client_key_is_one_clear_startup_error(
    client_cert: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    """There is no setting for a key's passphrase: OpenSSL asked for it on the terminal once
    per Kafka client, and with none the worker ended on "OSError: [Errno 22] Invalid argument"."""
    cert, key = client_cert
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret",
         "-out", str(encrypted)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    result = run_cli(
        command,
        KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9",
        KP_SECURITY_PROTOCOL="SSL",
        KP_SSL_CERTFILE=str(cert),
        KP_SSL_KEYFILE=str(encrypted),
    )
    assert "pass phrase" not in result.stdout + result.stderr, result.stderr
    _assert_one_clear_error(result.returncode, result.stdout, result.stderr, "KP_SSL_KEYFILE")
    assert "encrypted" in result.stderr, result.stderr


@pytest.mark.skipif(CA_FILE is None, reason="no CA bundle on this machine")
@pytest.mark.parametrize("defaults", ["this Python's", "Python 3.13's"])
def test_a_ca_that_kafka_clients_accept_verifies_on_every_python(
    defaults: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same KP_SSL_CAFILE connects on Python 3.11, 3.12 and 3.13. Python 3.13's default
    context refuses a CA whose basic constraints are not marked critical, which Kafka's own
    clients and Python 3.11 accept; "Python 3.13's" gives any Python that default. The broker
    is still verified: a CA that did not sign its certificate is refused."""
    certificates = make_broker_certificates(tmp_path)
    if defaults == "Python 3.13's":
        default_context = ssl.create_default_context

        def strict_context(*args: Any, **kwargs: Any) -> ssl.SSLContext:
            context = default_context(*args, **kwargs)
            context.verify_flags |= ssl.VERIFY_X509_STRICT
            return context

        monkeypatch.setattr(ssl, "create_default_context", strict_context)

    def context(cafile: Path) -> ssl.SSLContext:
        settings = load_settings(security_protocol="SSL", ssl_cafile=cafile)
        made: ssl.SSLContext = client_config(settings)["ssl_context"]
        return made

    handshake(context(certificates.ca), certificates.server_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(context(CA_FILE), certificates.server_context())


@pytest.mark.skipif(CA_FILE is None, reason="no CA bundle on this machine")
def test_settings_command_masks_the_password() -> None:
    result = run_cli(
        "settings",
        KP_SECURITY_PROTOCOL="SASL_SSL",
        KP_SASL_MECHANISM="SCRAM-SHA-256",
        KP_SASL_USERNAME="alice",
        KP_SASL_PASSWORD=PASSWORD,
        KP_SSL_CAFILE=str(CA_FILE),
    )
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    password_lines = [line for line in result.stdout.splitlines() if "KP_SASL_PASSWORD" in line]
    assert password_lines == ["KP_SASL_PASSWORD = **********"], password_lines
    assert "KP_SASL_USERNAME = alice" in result.stdout
    assert "KP_SECURITY_PROTOCOL = SASL_SSL" in result.stdout
    print(f"\n`kp-scorer settings` shows: {password_lines[0]}")
    # In-process too: the printable form never holds the secret.
    settings = load_settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="a",
        sasl_password=PASSWORD,
    )
    assert PASSWORD not in repr(by_variable(settings)) and PASSWORD not in repr(settings)


# -- settings that reach faust ----------------------------------------------------------------


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", "ERROR"])
def test_every_log_level_is_one_faust_accepts(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker hands KP_LOG_LEVEL to faust's CLI, whose names differ (warn, not warning)."""
    from faust.cli.base import LOGLEVELS

    from worker.cli import main as cli

    assert cli.FAUST_LOG_LEVELS[level].upper() in LOGLEVELS  # faust compares case-blind
