"""Prometheus metrics, one registry per app (tests build several apps in one process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SIGNS = ("positive", "negative")
#: the `reason` values of rofu_checkpoint_rejected_total
REJECTIONS = ("unrecorded", "mismatch", "oversized", "invalid", "unreadable")


class ServiceMetrics:
    """Every metric the API replica and its embedded trainer export."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rofu_http_requests_total",
            "HTTP requests by endpoint, method and status",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "rofu_http_request_duration_seconds",
            "HTTP request latency",
            ["endpoint", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "rofu_select_batch_size",
            "Requests scored together in one ROFU call",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.select_queue_depth = Gauge(
            "rofu_select_queue_depth",
            "/select and Rank requests the process holds: queued for the micro-batcher or in "
            "the batch being scored and stored (at most ROFU_SELECT_QUEUE_MAX)",
            registry=r,
        )
        self.select_shed = Counter(
            "rofu_select_shed_total",
            "/select and Rank requests refused with a 503 (overloaded) because the queue held "
            "ROFU_SELECT_QUEUE_MAX",
            registry=r,
        )
        self.reward_batch_size = Histogram(
            "rofu_reward_batch_size",
            "Rewards stored together in one transaction",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.selections = Counter(
            "rofu_selections_total",
            "Decisions made, by arm and policy (explore, exploit, cold-start, apprentice: "
            "rofu/service/rewards/metrics.py)",
            ["arm", "policy"],
            registry=r,
        )
        self.rewards = Counter(
            "rofu_rewards_total",
            "Reward posts by outcome (accepted, late: stored but never trained on, duplicate, "
            "conflict, ignored: another value on the Personalizer-compatible API, not used, "
            "unknown_event)",
            ["outcome"],
            registry=r,
        )
        self.rewarded = Counter(
            "rofu_rewarded_decisions_total",
            "Decisions whose reward was stored, once each (late ones included, repeats never: "
            "the accepted and late outcomes of rofu_rewards_total), by the chosen arm and by "
            "policy: how the decision was made (rofu/service/rewards/metrics.py)",
            ["arm", "policy"],
            registry=r,
        )
        self.reward_value = Counter(
            "rofu_reward_value",
            "Sum of the stored rewards' absolute values, by arm, policy and sign: the reward "
            'sum is sign="positive" minus sign="negative" (a counter never decreases)',
            ["arm", "policy", "sign"],
            registry=r,
        )
        self.uniform_rows = Counter(
            "rofu_uniform_ips_rows",
            "Rewarded decisions whose every candidate had a positive probability: the rows "
            "of the uniform policy's IPS estimate",
            registry=r,
        )
        self.uniform_weight = Counter(
            "rofu_uniform_ips_weight",
            "Sum over those rows of w = (1/K) / propensity (SNIPS divides by it)",
            registry=r,
        )
        self.uniform_value = Counter(
            "rofu_uniform_ips_value",
            'Sum over those rows of |w * reward|, by sign: the IPS numerator is sign="positive" '
            'minus sign="negative"',
            ["sign"],
            registry=r,
        )
        self.uniform_square = Counter(
            "rofu_uniform_ips_square",
            "Sum over those rows of (w * reward)^2, for the IPS estimate's standard error",
            registry=r,
        )
        for sign in SIGNS:  # both parts exported from the start, so their difference exists
            self.uniform_value.labels(sign)
        self.deferred = Counter(
            "rofu_deferred_decisions_total",
            "Deferred decisions by event: deferred (logged with defer), activated (in time), "
            "late (activated after its window or its consumption: never trained on), expired "
            "(consumed by the trainer without an activation in time: never trained on)",
            ["event"],
            registry=r,
        )
        for event in ("deferred", "activated", "late", "expired"):  # zero series from the start
            self.deferred.labels(event)
        self.database_errors = Counter(
            "rofu_database_errors_total",
            "Database failures (of requests, readiness probes and background refreshes) by "
            "cause: lock_timeout, pool_timeout, disk_full, read_only, connection, ... "
            "(rofu/service/db/faults.py)",
            ["cause"],
            registry=r,
        )
        self.model_version = Gauge(
            "rofu_model_version", "Version of the served checkpoint (0: none yet)", registry=r
        )
        self.checkpoint_age = Gauge(
            "rofu_checkpoint_age_seconds",
            "Age of the served checkpoint (0: none yet)",
            registry=r,
        )
        self.checkpoint_swaps = Counter(
            "rofu_checkpoint_swaps_total", "Checkpoints swapped in", registry=r
        )
        self.checkpoint_rejected = Counter(
            "rofu_checkpoint_rejected_total",
            "Checkpoint copies refused, by reason: unrecorded (a version the database does "
            "not hold), mismatch (not the bytes the database records), oversized, invalid "
            "(fails verification: damaged, another network or hash seed), unreadable "
            "(rofu/service/lifecycle/copies.py)",
            ["reason"],
            registry=r,
        )
        for reason in REJECTIONS:  # a zero series of each from the start
            self.checkpoint_rejected.labels(reason)
        self.checkpoints_quarantined = Counter(
            "rofu_checkpoints_quarantined_total",
            "Stored checkpoints found damaged and quarantined (never loaded again)",
            registry=r,
        )
        self.trainer_loss = Gauge("rofu_trainer_loss", "Training loss of the last fit", registry=r)
        self.trainer_ascent_rho = Gauge(
            "rofu_trainer_ascent_rho",
            "ROFU's step x the regulariser's largest curvature at the last checkpoint "
            "(at ROFU_STEP_SIZE, before any cap): the ascent is monotone up to 1, "
            "diverges past 2",
            registry=r,
        )
        self.learner_loss = Gauge(
            "rofu_learner_prequential_loss",
            "Each candidate learner's prequential squared loss at the last checkpoint: every "
            "new row scored before the refit that trains on it (ROFU_LEARNERS)",
            ["learner"],
            registry=r,
        )
        self.learner_served = Gauge(
            "rofu_learner_served",
            "1 for the candidate learner the last checkpoint serves, 0 for the others",
            ["learner"],
            registry=r,
        )
        self.trainer_rows = Counter(
            "rofu_trainer_rows_total",
            "Decisions consumed by the trainer, by use (rewarded, default, excluded)",
            ["use"],
            registry=r,
        )
        self.trainer_duration = Histogram(
            "rofu_trainer_duration_seconds",
            "Duration of one training run",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.trainer_published = Counter(
            "rofu_trainer_checkpoints_published_total",
            "Checkpoints stored and published",
            registry=r,
        )
        self.trainer_failures = Counter(
            "rofu_trainer_failures_total", "Training runs that failed", registry=r
        )
        self.trainer_skipped = Counter(
            "rofu_trainer_runs_skipped_total",
            "Training runs that stored nothing because another trainer held the lock "
            "(locked) or consumed their rows first (claim_lost)",
            ["reason"],
            registry=r,
        )
        for reason in ("locked", "claim_lost"):  # a zero series of each from the start
            self.trainer_skipped.labels(reason)
        self.gate_decisions = Counter(
            "rofu_gate_decisions_total",
            "Candidate checkpoints the trainer's evaluation gate decided, by decision "
            "(promoted: published and served; rejected: kept, never served) "
            "(rofu/service/lifecycle/gate.py)",
            ["decision"],
            registry=r,
        )
        for decision in ("promoted", "rejected"):  # a zero series of each from the start
            self.gate_decisions.labels(decision)
        self.gate_candidate = Gauge(
            "rofu_gate_candidate_version",
            "The candidate checkpoint awaiting the evaluation gate (0: none)",
            registry=r,
        )
        self.trainer_publish_failures = Counter(
            "rofu_trainer_publish_failures_total",
            "Stored checkpoints whose bus notice failed (replicas catch up by polling)",
            registry=r,
        )

    def track_checkpoint_age(self, created_at: Callable[[], float | None]) -> None:
        """Compute the served checkpoint's age at scrape time."""

        def age() -> float:
            stamp = created_at()
            return 0.0 if stamp is None else max(time.time() - stamp, 0.0)

        self.checkpoint_age.set_function(age)

    def track_select_queue(self, depth: Callable[[], int]) -> None:
        """Read the /select queue's depth at scrape time."""
        self.select_queue_depth.set_function(lambda: float(depth()))

    def record_learners(self, losses: Mapping[str, float | None], served: str) -> None:
        """Set each candidate learner's prequential loss (none yet: left unset) and which
        one is served."""
        for name, loss in losses.items():
            if loss is not None:
                self.learner_loss.labels(name).set(loss)
            self.learner_served.labels(name).set(1.0 if name == served else 0.0)
