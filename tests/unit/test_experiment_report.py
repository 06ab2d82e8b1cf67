"""GET /v1/report's statistics: intervals that cover, a confidence sequence that stays
valid under continuous monitoring, the sample-ratio check; and the endpoint itself."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rofu.service.deciding.holdout import in_holdout
from rofu.service.experiment.stats import compare, sample_ratio, summarise
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint


def test_group_summary_and_difference_match_the_textbook() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    summary = summarise(values)
    assert summary.units == 4
    assert summary.mean.estimate == 2.5
    assert summary.sd == pytest.approx(math.sqrt(5 / 3))
    half = 1.959963984540054 * math.sqrt(5 / 3) / 2
    assert (summary.mean.low, summary.mean.high) == pytest.approx((2.5 - half, 2.5 + half))
    assert summarise([]).mean.estimate is None
    assert summarise([3.0]).mean.low is None
    result = compare([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert result.difference.estimate == 2.0
    se = math.sqrt(4 / 3 + 1 / 3)
    assert result.difference.low == pytest.approx(2.0 - 1.959963984540054 * se)
    assert result.lift.estimate == pytest.approx(1.0)  # (4 - 2) / 2
    seq = result.sequence
    assert seq.low is not None
    assert result.difference.low is not None
    assert seq.low < result.difference.low  # the anytime-valid interval is the wider one
    too_few = compare([1.0], [1.0, 2.0])
    assert too_few.p_value is None
    assert not too_few.significant


def test_the_confidence_sequence_keeps_its_error_rate_under_continuous_monitoring() -> None:
    """Under no difference, reading the report after every 50 units up to 3 000 and
    stopping at the first 'significant' errs in about 5% of experiments or fewer; the
    fixed-sample interval, read the same way, errs far more often."""
    rng = np.random.default_rng(0)
    runs, looks = 300, range(100, 3001, 100)
    sequential = fixed = 0
    for _ in range(runs):
        r, h = rng.normal(size=2400), rng.normal(size=600)  # an 80/20 split
        seen_seq = seen_fixed = False
        for t in looks:
            result = compare(r[: int(t * 0.8)].tolist(), h[: int(t * 0.2)].tolist())
            seen_seq |= result.significant
            low, high = result.difference.low, result.difference.high
            assert low is not None
            assert high is not None
            seen_fixed |= low > 0 or high < 0
        sequential += seen_seq
        fixed += seen_fixed
    assert sequential / runs <= 0.06
    assert fixed / runs > 2 * max(sequential / runs, 0.05)


def test_the_confidence_sequence_finds_a_real_difference() -> None:
    rng = np.random.default_rng(1)
    result = compare((rng.normal(size=1600) + 0.3).tolist(), rng.normal(size=400).tolist())
    assert result.significant
    assert result.p_value is not None
    assert result.p_value < 0.05
    assert result.sequence.low is not None
    assert result.sequence.low > 0


def test_sample_ratio_flags_a_split_that_is_off() -> None:
    fine = sample_ratio(8_010, 1_990, 0.2)
    assert fine.p_value is not None
    assert fine.p_value > 0.5
    assert not fine.mismatch
    off = sample_ratio(7_700, 2_300, 0.2)  # 23% held out instead of 20%
    assert off.mismatch
    assert off.observed_holdout_share == 0.23
    assert sample_ratio(0, 0, 0.2).p_value is None


async def _post(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.anyio
async def test_report_compares_groups_by_unit_with_guardrails(sqlite_settings: Settings) -> None:
    settings = sqlite_settings.model_copy(update={"holdout_share": 0.25})
    seed_checkpoint(settings)
    units = [f"u{i}" for i in range(80)]
    async with app_client(settings) as (client, _):
        empty = (await client.get("/v1/report")).json()
        assert empty["groups"]["rofu"]["decisions"] == 0
        assert "too few rewarded units" in " ".join(empty["warnings"])
        for round_ in range(3):
            for unit in units:
                decision = await _post(
                    client, "/v1/select", {"context": [0.1] * 4, "unit_id": unit}
                )
                held = decision["experiment"] == "holdout"
                value = (0.0 if held else 1.0) + 0.1 * round_
                body = {"event_id": decision["event_id"], "value": value}
                if round_ < 2:
                    body["metrics"] = {"latency_ms": 100.0 + (20.0 if held else 0.0) + round_}
                await _post(client, "/v1/reward", body)
        report = (await client.get("/v1/report")).json()
        later = (await client.get("/v1/report", params={"since": "2999-01-01"})).json()
        bad = await client.get("/v1/report", params={"since": "yesterday"})
    held = sum(in_holdout(0.25, "holdout", u) for u in units)
    assert report["groups"]["holdout"] == {
        "decisions": 3 * held,
        "units": held,
        "rewarded": 3 * held,
    }
    assert report["groups"]["rofu"]["units"] == len(units) - held
    reward = report["reward"]
    assert reward["holdout"]["units"] == held  # one outcome per unit: its mean
    assert reward["difference"]["estimate"] == pytest.approx(1.0)
    assert reward["significant"]
    assert reward["sequential"]["low"] > 0
    latency = report["guardrails"]["latency_ms"]
    assert latency["difference"]["estimate"] == pytest.approx(-20.0)
    assert set(report["guardrails"]) == {"latency_ms"}
    assert not report["sample_ratio"]["mismatch"]
    assert report["holdout_share"] == 0.25
    assert report["salt"] == "holdout"
    assert later["groups"]["rofu"]["decisions"] == 0
    assert bad.status_code == 422
