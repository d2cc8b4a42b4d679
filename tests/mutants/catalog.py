"""The product's promises, a named mutant that breaks each one, and the tests that guard it.

Each mutant is one exact text replacement in one file: ``old`` must occur exactly once there,
so a mutant that no longer applies (the code moved or changed) is reported, never skipped.
``tests`` are pytest node ids (file or test) run against the mutated copy, the fastest first;
the first of them to fail kills the mutant. When you move guarded code, move its mutant with
it: ``python -m tests.mutants --check`` says which no longer apply.
"""

from __future__ import annotations

from dataclasses import dataclass

AT_LEAST_ONCE_UNIT = "tests/unit/stream/test_at_least_once.py"
AT_LEAST_ONCE_BROKER = "tests/chaos/test_at_least_once_broker.py"
CACHE_STORE_UNIT = "tests/unit/stream/test_cache_store.py"
GROUP_CONSUMER_UNIT = "tests/unit/io/test_group_consumer.py"
CACHE_BOUNDARIES = (
    "tests/unit/core/test_cache.py::"
    "test_a_batch_sees_stored_entries_up_to_their_ttl_and_capacity_boundaries"
)
EXACTLY_ONCE_ZOMBIE = (
    "tests/broker/test_exactly_once.py::"
    "test_a_zombies_transaction_is_aborted_and_its_late_commit_refused"
)
EXACTLY_ONCE_WORKER = (
    "tests/broker/test_exactly_once.py::test_a_worker_in_exactly_once_mode_scores_each_record_once"
)
BROKER_KILL = f"{AT_LEAST_ONCE_BROKER}::test_a_kill_while_outputs_wait_on_the_broker_loses_nothing"
BROKER_SIGTERM = (
    f"{AT_LEAST_ONCE_BROKER}::test_a_sigterm_while_outputs_wait_on_the_broker_commits_none_of_them"
)


@dataclass(frozen=True)
class Mutant:
    """A change that breaks ``promise``; ``tests`` must fail on it."""

    name: str
    promise: str
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]
    why: str  # what the mutant does, in product terms


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="acknowledge-before-publish",
        promise="An input offset is acknowledged (and committed) only after the broker "
        "acknowledged its output",
        path="worker/stream/checkpoint.py",
        old="""\
        await self.publisher.publish(routed)
        acked = time.monotonic()
        if acknowledge is not None:
            await acknowledge()
""",
        new="""\
        if acknowledge is not None:
            await acknowledge()
        await self.publisher.publish(routed)
        acked = time.monotonic()
""",
        tests=(AT_LEAST_ONCE_UNIT, BROKER_KILL),
        why="acknowledges the input offset before publishing its output",
    ),
    Mutant(
        name="acknowledge-a-failed-publish",
        promise="An input offset is acknowledged (and committed) only after the broker "
        "acknowledged its output",
        path="worker/stream/checkpoint.py",
        old="""\
        await self.publisher.publish(routed)
        acked = time.monotonic()
""",
        new="""\
        try:
            await self.publisher.publish(routed)
        except ConnectionError:
            log.warning("publish failed; going on")
        acked = time.monotonic()
""",
        tests=(AT_LEAST_ONCE_UNIT,),
        why="swallows a publish error and acknowledges the offset anyway",
    ),
    Mutant(
        name="redelivered-acknowledged-at-once",
        promise="An input offset is acknowledged (and committed) only after the broker "
        "acknowledged its output",
        path="worker/stream/checkpoint.py",
        old="""\
        await asyncio.gather(*waiting, return_exceptions=True)
        await acknowledge()
""",
        new="""\
        await acknowledge()
""",
        tests=(AT_LEAST_ONCE_UNIT,),
        why="acknowledges a redelivered offset while its first delivery still waits on the broker",
    ),
    Mutant(
        name="consumer-acknowledges-on-receipt",
        promise="An input offset is acknowledged (and committed) only after the broker "
        "acknowledged its output",
        path="worker/io/group_consumer.py",
        old="""\
            acknowledge = self.acknowledgements.delivered(tp, record.offset)
""",
        new="""\
            acknowledge = self.acknowledgements.delivered(tp, record.offset)
            await acknowledge()
""",
        tests=(
            f"{GROUP_CONSUMER_UNIT}::test_a_record_is_committed_only_once_its_output_is_published",
            BROKER_KILL,
        ),
        why="acknowledges each record as the consumer hands it over, before its output is "
        "published",
    ),
    Mutant(
        name="abandoned-records-acknowledged",
        promise="A SIGTERM commits nothing that was not published",
        path="worker/stream/processor.py",
        old="""\
            if isinstance(exc, asyncio.CancelledError):
                raise
""",
        new="""\
            if isinstance(exc, asyncio.CancelledError):
                if job.acknowledge is not None:
                    await job.acknowledge()
                raise
""",
        tests=(
            f"{AT_LEAST_ONCE_UNIT}::test_a_stop_acknowledges_nothing_the_broker_did_not_take",
            BROKER_SIGTERM,
        ),
        why="acknowledges the records a stop abandons while they wait on the broker",
    ),
    Mutant(
        name="records-after-the-stop-acknowledged",
        promise="A SIGTERM commits nothing that was not published",
        path="worker/stream/processor.py",
        old="""\
                job.published.set_result(None)
                continue
""",
        new="""\
                job.published.set_result(None)
                if job.acknowledge is not None:
                    await job.acknowledge()
                continue
""",
        tests=(f"{AT_LEAST_ONCE_UNIT}::test_a_stop_acknowledges_nothing_the_broker_did_not_take",),
        why="acknowledges records handed over after the stop began, unscored",
    ),
    Mutant(
        name="commit-goes-backwards",
        promise="A committed offset never goes backwards",
        path="worker/stream/checkpoint.py",
        old="if last is not None and offset < last:",
        new="if last is not None and offset < 0:",
        tests=(
            f"{GROUP_CONSUMER_UNIT}::"
            "test_a_commit_that_would_go_backwards_never_reaches_the_broker",
        ),
        why="lets the consumer commit an offset below its last commit, so records already "
        "committed are delivered again",
    ),
    Mutant(
        name="unconfirmed-commit-taken-as-confirmed",
        promise="A stop exits 75 when the commits of published records are unconfirmed",
        path="worker/stream/checkpoint.py",
        old="return offset is not None and offset >= position",
        new="return offset is None or offset >= position",
        tests=(
            "tests/unit/stream/test_outage_logging.py::"
            "test_a_stop_is_clean_only_when_every_published_offset_is_confirmed_committed",
        ),
        why="counts a partition with no committed offset as committed",
    ),
    Mutant(
        name="unconfirmed-stop-exits-0",
        promise="A stop exits 75 when the commits of published records are unconfirmed",
        path="worker/io/app.py",
        old="""\
        if self.app.left_uncommitted:  # type: ignore[attr-defined]
            raise SystemExit(EXIT_DEADLINE)
""",
        new="""\
        if self.app.left_uncommitted:  # type: ignore[attr-defined]
            return
""",
        tests=(f"{AT_LEAST_ONCE_UNIT}::test_a_stop_that_cannot_confirm_its_commits_exits_75",),
        why="exits 0 although published records' offsets may not be committed",
    ),
    Mutant(
        name="delivered-record-taken-for-redelivered",
        promise="Every input record ends in exactly one output (none lost)",
        path="worker/stream/partitions.py",
        old="if record.offset < expected:",
        new="if record.offset <= expected:",
        tests=("tests/unit/stream/test_stream.py",),
        why="skips the record at the next expected offset as if it had been scored",
    ),
    Mutant(
        name="redelivered-record-scored-again",
        promise="Every input record ends in exactly one output (none twice, short of a crash)",
        path="worker/stream/partitions.py",
        old="""\
                    admitted.redelivered.append(record)  # its embedding is in the cache
                    continue
""",
        new="""\
                    admitted.redelivered.append(record)  # its embedding is in the cache
""",
        tests=("tests/unit/stream/test_stream.py::test_redelivered_records_are_not_scored_twice",),
        why="scores and publishes a redelivered record a second time",
    ),
    Mutant(
        name="scoring-bug-drops-the-record",
        promise="Every input record ends in exactly one output (a scoring bug dead-letters)",
        path="worker/core/failures.py",
        old='return dead_letter(record, InternalScoringError(f"scoring failed: {exc!r}"[:300]))',
        new="raise",
        tests=("tests/unit/core/test_pipeline.py::test_internal_error_is_dead_lettered_not_lost",),
        why="lets a scoring bug escape instead of dead-lettering the record",
    ),
    Mutant(
        name="gap-not-read-from-the-log",
        promise="Records the consumer skipped are read from the log and scored",
        path="worker/stream/partitions.py",
        old="admitted.to_score += await self._read_gap(tp, expected, record.offset)",
        new="await self._read_gap(tp, expected, record.offset)",
        tests=(
            "tests/unit/stream/test_stream.py::test_gap_before_first_delivery_is_read_from_the_log",
            "tests/unit/stream/test_stream.py::test_gap_inside_and_between_batches",
        ),
        why="reads the skipped records but never scores them",
    ),
    Mutant(
        name="takeover-without-rebuild",
        promise="A worker taking over a partition rebuilds its cache from the records "
        "before the committed offset",
        path="worker/stream/partitions.py",
        old="            await self.rebuild_cache(tp, start)\n",
        new="            pass\n",
        tests=(
            "tests/unit/stream/test_stream.py::"
            "test_takeover_rebuilds_the_cache_from_before_the_committed_offset",
        ),
        why="starts a taken-over partition with an empty novelty cache",
    ),
    Mutant(
        name="revoked-cache-kept",
        promise="A revoked partition's cache is dropped",
        path="worker/stream/partitions.py",
        old="""\
            self._last_scored.pop(tp, None)
            self.scorer.drop_partition(tp)
            self.observer.partition_forgotten(tp)
""",
        new="""\
            self._last_scored.pop(tp, None)
            self.observer.partition_forgotten(tp)
""",
        tests=(
            "tests/unit/stream/test_stream.py::test_partition_revoked_while_scoring_leaves_no_state",
            "tests/unit/stream/test_stream.py::test_failed_publish_forgets_the_partition_and_raises",
        ),
        why="keeps the novelty cache of a partition this worker no longer owns",
    ),
    Mutant(
        name="ttl-boundary-exclusive",
        promise="Event-time TTL: an entry exactly TTL old is still live",
        path="worker/core/cache.py",
        old="held &= held_times[:, None] >= live_from",
        new="held &= held_times[:, None] > live_from",
        tests=(CACHE_BOUNDARIES, "tests/unit/core/test_cache.py"),
        why="expires a cached vector one millisecond early",
    ),
    Mutant(
        name="capacity-off-by-one",
        promise="Capacity: the cache holds exactly the last `capacity` vectors",
        path="worker/core/cache.py",
        old="held = self._age_rank()[:, None] >= (n + position - self.max_elements)[None, :]",
        new="held = self._age_rank()[:, None] > (n + position - self.max_elements)[None, :]",
        tests=(CACHE_BOUNDARIES, "tests/unit/core/test_cache.py"),
        why="evicts the oldest vector one trace too soon",
    ),
    Mutant(
        name="cache-store-entry-of-another-embedder",
        promise="A cache restored from the store is bit-identical to one embedded again: an "
        "entry is used only by the embedder that wrote it",
        path="worker/core/cache_store.py",
        old="if not key or not key.startswith(tag) or value is None",
        new="if not key or value is None",
        tests=(
            f"{CACHE_STORE_UNIT}::test_an_entry_reads_back_bit_for_bit_for_its_own_embedder_only",
        ),
        why="a worker given another model restores its caches with the old model's vectors",
    ),
    Mutant(
        name="cache-store-unsound-row-used",
        promise="A cache restored from the store is bit-identical to one embedded again: a "
        "stored row off the cache's grid or of another length is embedded again",
        path="worker/core/cache.py",
        old="    return on_grid and (norm == 0.0 or abs(norm - 1.0) < _SCREEN_MARGIN)",
        new="    return True",
        tests=(f"{CACHE_STORE_UNIT}::test_unsound_entries_are_not_used",),
        why="a damaged or forged store entry goes into a cache and changes novelty",
    ),
    Mutant(
        name="rebuilding-partition-fetched",
        promise="A partition taken over is scored as soon as its own cache is ready: its "
        "records are not fetched before, so none holds the others' behind it",
        path="worker/stream/partitions.py",
        old="            self.hold_fetching(tp, True)\n",
        new="",
        tests=(f"{CACHE_STORE_UNIT}::test_a_partition_is_not_fetched_until_its_cache_is_ready",),
        why="a record of a partition still rebuilding holds every partition's records behind it",
    ),
    Mutant(
        name="threshold-exclusive",
        promise="A trace is accepted when score >= threshold",
        path="worker/core/records.py",
        old="return cls.ACCEPTED if score >= threshold else cls.REJECTED",
        new="return cls.ACCEPTED if score > threshold else cls.REJECTED",
        tests=("tests/unit/core/test_pipeline.py::test_score_equal_to_threshold_is_accepted",),
        why="rejects a trace scoring exactly the threshold",
    ),
    Mutant(
        name="error-recovery-bonus-at-two",
        promise="Scoring: the error-recovery bonus needs more than 2 recoveries",
        path="worker/core/scoring.py",
        old="if error_recoveries > 2 and trace.success:",
        new="if error_recoveries >= 2 and trace.success:",
        tests=("tests/unit/core/test_scoring.py",),
        why="gives the bonus to a trace with exactly 2 error recoveries",
    ),
    Mutant(
        name="dead-letter-value-rewritten",
        promise="A dead letter keeps the original bytes (a tombstone stays a tombstone)",
        path="worker/core/output.py",
        old="return _dead_letter(record, error, record.value, input_headers=True)",
        new='return _dead_letter(record, error, record.value or b"", input_headers=True)',
        tests=("tests/unit/core/test_pipeline.py::test_dead_letter_keeps_bytes_and_explains",),
        why="publishes an empty value for a tombstone",
    ),
    Mutant(
        name="dead-letter-headers-replaced",
        promise="A dead letter keeps the original headers",
        path="worker/core/output.py",
        old="return _dead_letter(record, error, record.value, input_headers=True)",
        new="return _dead_letter(record, error, record.value, input_headers=False)",
        tests=("tests/unit/core/test_pipeline.py::test_dead_letter_keeps_bytes_and_explains",),
        why="drops the producer's headers from a dead letter",
    ),
    Mutant(
        name="dead-letter-key-dropped",
        promise="A dead letter keeps the original key",
        path="worker/core/records.py",
        old="""\
    def key(self) -> bytes | None:
        return b"" if self.empty_key else self.source.key
""",
        new="""\
    def key(self) -> bytes | None:
        return None if self.error is not None else self.source.key
""",
        tests=("tests/unit/core/test_pipeline.py::test_dead_letter_keeps_bytes_and_explains",),
        why="publishes dead letters without their key",
    ),
    Mutant(
        name="kp-headers-case-sensitive",
        promise="Headers reading as kp- (any case, NFKC-normalised) are the scorer's alone",
        path="worker/core/output.py",
        old='for c in unicodedata.normalize("NFKC", name).casefold()',
        new="for c in name",
        tests=(
            "tests/unit/core/test_pipeline.py::test_producer_kp_headers_never_reach_an_output",
            "tests/unit/core/test_header_names.py",
        ),
        why="lets a producer's KP-Score or fullwidth ｋｐ-decision header through to an output",
    ),
    Mutant(
        name="domain-label-unbounded",
        promise="Domain labels are bounded: configured profiles plus `other`",
        path="worker/core/scorer.py",
        old="return domain if domain in self.profiles.names else OTHER_DOMAIN",
        new="return domain or OTHER_DOMAIN",
        tests=("tests/unit/core/test_pipeline.py::test_domain_labels_are_bounded",),
        why="labels metrics with whatever domain a producer sends",
    ),
    Mutant(
        name="null-key-tombstone-unpublishable",
        promise="Any record gets a dead letter that can be published (a null key with a null "
        "value gets an empty key and kp-key-null)",
        path="worker/core/output.py",
        old="    empty_key = record.key is None and value is None\n",
        new="    empty_key = False\n",
        tests=(
            "tests/unit/io/test_publisher.py::"
            "test_a_null_key_tombstone_is_dead_lettered_with_an_empty_key",
        ),
        why="hands the Kafka client a record with neither key nor value, which it refuses",
    ),
    Mutant(
        name="integer-beyond-64-bits-passed-as-float",
        promise="No silent change of data: an integer beyond 64 bits is dead-lettered",
        path="worker/core/trace.py",
        old="_INT_DIGITS = 19",
        new="_INT_DIGITS = 400",
        tests=(
            "tests/unit/core/test_trace.py::"
            "test_an_integer_beyond_64_bits_in_an_unknown_field_is_refused_by_path",
        ),
        why="publishes 123456789012345678901234567890 as 1.2345678901234568e+29",
    ),
    Mutant(
        name="framed-record-read-as-text",
        promise="A framed record scores as its document: a Schema Registry frame (magic byte "
        "0, 4-byte schema id) is unwrapped, and the record scores as the plain JSON would",
        path="worker/core/trace.py",
        old="""\
    if framing == "json":
        return raw, None
""",
        new="""\
    if framing != "confluent":
        return raw, None
""",
        tests=(
            "tests/unit/core/test_framing.py::test_a_framed_record_scores_as_its_plain_document",
            "tests/broker/test_framing_broker.py::"
            "test_framed_and_plain_records_score_alike_on_a_worker",
        ),
        why="dead-letters every record from a registry serializer as invalid_json by default",
    ),
    Mutant(
        name="created-at-not-checked",
        promise="created_at is RFC 3339",
        path="worker/core/schema.py",
        old="Draft202012Validator(schema, validate_formats=True, registry=registry)",
        new="Draft202012Validator(schema, validate_formats=False, registry=registry)",
        tests=("tests/unit/core/test_schema.py::test_created_at_is_rfc_3339",),
        why="accepts any string as created_at",
    ),
    Mutant(
        name="future-timestamp-pins-lag",
        promise="Lag seconds cannot be pinned at 0 by a record timestamped in the future",
        path="worker/stream/lag.py",
        old="                seconds = min(seconds, now)\n",
        new="                seconds = seconds\n",
        tests=("tests/unit/stream/test_health_lag.py",),
        why="one record stamped an hour ahead reads as no lag for an hour",
    ),
    Mutant(
        name="broker-reachable-before-it-answered",
        promise="kp_broker_reachable is 0 until the broker has answered",
        path="worker/stream/connectivity.py",
        old="        self.reachable = False\n        self.ever_reached = False\n",
        new="        self.reachable = True\n        self.ever_reached = False\n",
        tests=(
            "tests/unit/stream/test_outage_logging.py::"
            "test_a_broker_never_reached_is_unreachable_and_not_ready",
        ),
        why="a worker with a wrong bootstrap address reads as connected",
    ),
    Mutant(
        name="library-debug-logs-kept",
        promise="No trace content in logs at any level: libraries are held at INFO",
        path="worker/logs.py",
        old="""\
        return record.levelno >= logging.INFO or _within(record.name, (OWN_LOGGER,))
""",
        new="""\
        return record.levelno >= logging.DEBUG or _within(record.name, (OWN_LOGGER,))
""",
        tests=(
            "tests/unit/test_log_levels.py::"
            "test_library_debug_records_are_dropped_even_where_a_library_sets_debug",
        ),
        why="lets the Kafka client's DEBUG lines, every published value in full, through",
    ),
    Mutant(
        name="whole-text-tokenized",
        promise="Tokenizing is bounded: a text is read up to max_tokens x 64 characters",
        path="worker/embedding/encoder.py",
        old="return self.tokenizer.encode_batch_fast([text[:cut] for text in texts])",
        new="return self.tokenizer.encode_batch_fast(list(texts))",
        tests=(
            "tests/unit/embedding/test_embedder.py::"
            "test_megabyte_text_is_tokenized_from_a_bounded_cut_without_the_lock",
        ),
        why="tokenizes a 1 MiB text whole: up to 2.5 s on a model thread",
    ),
    Mutant(
        name="unreadable-batch-ends-the-consumer",
        promise="A batch the Kafka client cannot read is dead-lettered (unreadable), never a "
        "crash loop",
        path="worker/io/unreadable.py",
        old="""\
            return iter(list(batch))
        except Exception as exc:""",
        new="""\
            return iter(list(batch))
        except ArithmeticError as exc:""",
        tests=(
            "tests/unit/io/test_unreadable.py::"
            "test_an_unreadable_batch_is_one_unreadable_record_per_offset",
        ),
        why="a header name that is not UTF-8 ends the consumer at that offset on every restart",
    ),
    Mutant(
        name="compression-bomb-decompressed-whole",
        promise="No batch is decompressed past KP_MAX_BATCH_BYTES",
        path="worker/io/unreadable.py",
        old="    for module in (default_records, compiled_default_records):\n",
        new="    for module in ():\n",
        tests=(
            "tests/unit/io/test_unreadable.py::"
            "test_a_compression_bomb_is_unreadable_records_not_a_whole_decompression",
        ),
        why="a 1 MiB gzip batch costs 2.3 GB of memory, a zstd one tens of GB",
    ),
    Mutant(
        name="aborted-transactions-scored",
        promise="A producer's aborted transactions are never scored",
        path="worker/io/group_consumer.py",
        old='        "isolation_level": "read_committed",\n',
        new='        "isolation_level": "read_uncommitted",\n',
        tests=(
            f"{GROUP_CONSUMER_UNIT}::test_the_consumer_reads_committed_records_as_the_settings_say",
            "tests/unit/io/test_fetch_bounds.py::test_every_consumer_bounds_a_whole_fetch",
            "tests/broker/test_transactional_producers.py",
        ),
        why="the worker reads read_uncommitted, so traces a producer took back are published",
    ),
    Mutant(
        name="transaction-marker-ends-the-consumer",
        promise="A producer's aborted transactions are never scored",
        path="worker/io/unreadable.py",
        old="    def __next__(self) -> Any:\n",
        new="    def _next(self) -> Any:\n",
        tests=(
            "tests/unit/io/test_unreadable.py::"
            "test_a_read_committed_fetch_skips_an_aborted_transaction_as_aiokafka_does",
        ),
        why="the first abort marker a read_committed fetch meets crashes the consumer",
    ),
    Mutant(
        name="lost-records-uncounted",
        promise="Records deleted from the input log before they were scored are counted",
        path="worker/stream/partitions.py",
        old="            if lost_until > start:\n",
        new="            if lost_until > end:\n",
        tests=(
            "tests/unit/stream/test_log_restarts.py::"
            "test_records_deleted_before_they_were_scored_are_counted_lost",
        ),
        why="records retention deleted before they were scored vanish with no line and no count",
    ),
    Mutant(
        name="restarted-log-taken-for-redeliveries",
        promise="A partition whose log went back (topic recreated, truncated) is scored again "
        "from the new log",
        path="worker/stream/partitions.py",
        old="        if end >= reached and sent_back is None:\n",
        new="        if sent_back is None:\n",
        tests=(
            "tests/unit/stream/test_log_restarts.py::"
            "test_a_recreated_log_is_scored_from_its_new_start",
            "tests/broker/test_input_log_changes.py::"
            "test_a_recreated_input_topic_is_scored_from_its_new_start",
        ),
        why="a recreated topic's records are taken for redeliveries: never scored, lag 0",
    ),
    Mutant(
        name="added-partitions-seen-after-minutes",
        promise="Partitions added to the input topic are scored within 30 s",
        path="worker/io/group_consumer.py",
        old="METADATA_MAX_AGE_SECONDS = 10\n",
        new="METADATA_MAX_AGE_SECONDS = 300\n",
        tests=(
            f"{GROUP_CONSUMER_UNIT}::test_the_consumer_reads_committed_records_as_the_settings_say",
            "tests/broker/test_input_log_changes.py::"
            "test_a_partition_added_while_the_worker_runs_is_scored_in_time",
        ),
        why="a partition added to the input topic waits up to 5 minutes for a reader",
    ),
    Mutant(
        name="refused-permission-reads-ready",
        promise="A permission the broker refuses is one line naming it, and /readyz fails",
        path="worker/stream/permissions.py",
        old='        if not refused:\n            return "ok"\n',
        new='        if refused or not refused:\n            return "ok"\n',
        tests=(
            "tests/unit/stream/test_permissions.py::"
            "test_readiness_fails_while_a_permission_is_refused",
        ),
        why="a worker refused Write on an output topic says it is ready while nothing publishes",
    ),
    Mutant(
        name="offsets-left-out-of-the-transaction",
        promise="Exactly-once: a partition's input offset commits in the same transaction as "
        "its outputs",
        path="worker/io/transactions.py",
        old="""\
                await owned.producer.send_offsets_to_transaction(
                    {TopicPartition(*tp): offset}, self._group_id
                )
                await owned.producer.commit_transaction()
""",
        new="""\
                await owned.producer.commit_transaction()
""",
        tests=(EXACTLY_ONCE_ZOMBIE, EXACTLY_ONCE_WORKER),
        why="the outputs commit without the offsets they answer: a restart scores them again",
    ),
    Mutant(
        name="offsets-committed-outside-the-transaction",
        promise="Exactly-once: nothing commits input offsets but the partitions' transactions",
        path="worker/io/group_consumer.py",
        old="""\
                self.stream.checkpoint.committed(offsets)
                return True
            assigned = """,
        new="""\
                self.stream.checkpoint.committed(offsets)
            assigned = """,
        tests=(
            f"{GROUP_CONSUMER_UNIT}::"
            "test_exactly_once_commits_offsets_only_in_the_partitions_transactions",
        ),
        why="the consumer also commits acknowledged offsets itself, whether or not the "
        "transaction holding their outputs commits",
    ),
    Mutant(
        name="producers-started-after-the-offset-read",
        promise="Exactly-once: a partition's previous owner is fenced before its committed "
        "offset is read",
        path="worker/io/group_consumer.py",
        old="""\
                await self.transactions.fence(now_assigned)
                for tp in sorted(assigned):
                    committed = await consumer.committed(tp)
                    if committed is None:
                        await consumer.seek_to_beginning(tp)
                    else:
                        consumer.seek(tp, committed)
                    self._seeking.discard((tp.topic, tp.partition))
""",
        new="""\
                for tp in sorted(assigned):
                    committed = await consumer.committed(tp)
                    if committed is None:
                        await consumer.seek_to_beginning(tp)
                    else:
                        consumer.seek(tp, committed)
                    self._seeking.discard((tp.topic, tp.partition))
                await self.transactions.fence(now_assigned)
""",
        tests=(
            f"{GROUP_CONSUMER_UNIT}::"
            "test_exactly_once_fences_the_previous_owners_before_reading_committed_offsets",
        ),
        why="the new owner reads the committed offset while the previous owner may still "
        "commit a transaction: its outputs are scored and published again",
    ),
    Mutant(
        name="zombie-allowed-to-commit",
        promise="Exactly-once: a worker whose partition moved away commits nothing more of it",
        path="worker/io/transactions.py",
        old='        return f"{self._group_id}:{tp[0]}:{tp[1]}"\n',
        new='        return f"{self._group_id}:{tp[0]}:{tp[1]}:{id(self)}"\n',
        tests=(EXACTLY_ONCE_ZOMBIE,),
        why="each worker's transactional id is its own, so taking a partition over fences "
        "nobody: the paused worker's outputs commit beside the new owner's",
    ),
)
