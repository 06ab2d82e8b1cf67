"""The pure parts of the load benchmark: no server is started here."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from rofu.bench import load, load_inprocess, load_report, load_wrk
from rofu.models.presets import PRODUCT
from rofu.service.settings import Settings

METRICS_TEXT = """\
# HELP rofu_select_batch_size Requests scored together in one ROFU call
# TYPE rofu_select_batch_size histogram
rofu_select_batch_size_bucket{le="1.0"} 3.0
rofu_select_batch_size_bucket{le="+Inf"} 7.0
rofu_select_batch_size_count 7.0
rofu_select_batch_size_sum 40.0
rofu_http_requests_total{endpoint="/v1/select",method="POST",status="200"} 12.0
rofu_model_version 1.0
"""


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert load_report.percentile(values, 0) == 1.0
    assert load_report.percentile(values, 100) == 4.0
    assert load_report.percentile(values, 50) == pytest.approx(2.5)
    assert load_report.percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert load_report.percentile([5.0], 99) == 5.0


def test_percentile_empty_is_nan_and_q_is_checked() -> None:
    assert math.isnan(load_report.percentile([], 50))
    with pytest.raises(ValueError, match="q must be"):
        load_report.percentile([1.0], 101)


def test_parse_metrics_reads_samples_and_skips_comments() -> None:
    samples = load_report.parse_metrics(METRICS_TEXT)
    assert samples["rofu_select_batch_size_count"] == 7.0
    assert samples["rofu_select_batch_size_sum"] == 40.0
    assert samples['rofu_select_batch_size_bucket{le="+Inf"}'] == 7.0
    assert (
        samples['rofu_http_requests_total{endpoint="/v1/select",method="POST",status="200"}'] == 12
    )
    assert not any(key.startswith("#") for key in samples)


def test_histogram_delta_and_mean_batch_across_visits() -> None:
    before = load_report.parse_metrics(METRICS_TEXT)
    after = dict(before)
    after["rofu_select_batch_size_count"] = 11.0  # 4 batches ...
    after["rofu_select_batch_size_sum"] = 72.0  # ... of 32 requests
    assert load_report.histogram_delta(before, after, load_report.BATCH_METRIC) == (32.0, 4.0)
    assert load_report.histogram_delta({}, before, load_report.BATCH_METRIC) == (40.0, 7.0)
    level = load_report.Level(concurrency=8)
    assert level.mean_batch is None
    level.batch_sum, level.batch_count = 32.0 + 8.0, 4.0 + 4.0
    assert level.mean_batch == 5.0


def test_concurrency_levels_parse_and_refuse() -> None:
    assert load.concurrency_levels("1,8,64") == (1, 8, 64)
    for bad in ("", "1,x", "0,8", "8,8", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            load.concurrency_levels(bad)


def test_parse_args_defaults_and_validation(capsys: pytest.CaptureFixture[str]) -> None:
    args = load.parse_args([])
    assert args.concurrency == (1, 8, 64)
    assert args.n_data == 20_000
    assert 0 <= args.reward_fraction <= 1
    assert (args.workers, args.torch_threads) == (1, None)
    for bad in (
        ["--reward-fraction", "1.5"],
        ["--seconds", "0"],
        ["--n-data", "100"],
        ["--rounds", "0"],
        ["--requests", "2", "--rounds", "3"],
        ["--workers", "0"],
        ["--torch-threads", "0"],
        ["--trainer", "--workers", "2"],
        ["--database-url", "sqlite:///x.db"],
    ):
        with pytest.raises(SystemExit):
            load.parse_args(bad)
    assert "--database-url must be" in capsys.readouterr().err


def test_server_settings_are_the_reference_workload() -> None:
    args = load.parse_args(["--n-data", "5000"])
    overrides = load.server_overrides(args, "sqlite:///bench.sqlite")
    env = load.as_environment(overrides)
    assert env["ROFU_HIDDEN"] == "[100, 100]"
    assert env["ROFU_EMBEDDED_TRAINER"] == "false"
    assert [arm["id"] for arm in json.loads(env["ROFU_ARMS"])] == [f"arm-{i}" for i in range(10)]
    assert "ROFU_TORCH_THREADS" not in env  # torch's default unless asked
    settings = Settings(**overrides)
    net = settings.net_config()
    assert (net.context_dim, net.n_arms, net.hidden) == (64, 10, (100, 100))
    assert (settings.rofu_config().steps, settings.rofu_config().minibatch_size) == (5, 256)
    assert settings.torch_threads == 0


def test_server_settings_pass_torch_threads_and_workers() -> None:
    args = load.parse_args(["--torch-threads", "1", "--workers", "2"])
    overrides = load.server_overrides(args, "sqlite:///bench.sqlite")
    assert load.as_environment(overrides)["ROFU_TORCH_THREADS"] == "1"
    assert Settings(**overrides).torch_threads == 1
    assert not Settings(**overrides).in_process_trainer  # so `rofu serve --workers 2` may run
    assert args.workers == 2


def test_server_serves_the_service_estimator_unless_told() -> None:
    default = load.parse_args([])
    assert Settings(**load.server_overrides(default, "sqlite:///b.sqlite")).estimator == (
        PRODUCT.rofu.estimator
    )
    exact = load.server_overrides(load.parse_args(["--estimator", "exact"]), "sqlite:///b.sqlite")
    assert load.as_environment(exact)["ROFU_ESTIMATOR"] == "exact"
    with pytest.raises(SystemExit):
        load.parse_args(["--estimator", "fast"])


WRK_LINE = (
    'ROFU_WRK {"requests": 1210, "duration_us": 2000000, "connect_errors": 0, '
    '"read_errors": 1, "write_errors": 0, "timeouts": 2, "p50_us": 20000, "p90_us": 30000, '
    '"p99_us": 40000, "max_us": 90000, "statuses": {"200": 1000, "503": 200, "500": 10}}'
)


def _wrk(ok: int, seconds: float, p50: float, p99: float) -> load_wrk.WrkRun:
    return load_wrk.WrkRun(ok, seconds, {200: ok}, 0, p50, p50, p99)


def _level() -> load_report.Level:
    level = load_report.Level(concurrency=8, seconds=2.0)
    level.select = [0.010, 0.020, 0.030, 0.040]
    level.select_errors, level.reward_errors = 1, 2
    level.reward = [0.005]
    level.batch_sum, level.batch_count = 12.0, 4.0
    level.wrk_select.runs += [_wrk(300, 2.0, 0.020, 0.050), _wrk(100, 2.0, 0.030, 0.070)]
    level.wrk_floor.runs += [_wrk(2000, 2.0, 0.002, 0.010), _wrk(2000, 2.0, 0.004, 0.030)]
    return level


def test_wrk_run_parses_the_scripts_line_and_tells_503s_from_errors() -> None:
    run = load_wrk.WrkRun.parse("Running 2s test\n" + WRK_LINE + "\n")
    assert (run.requests, run.seconds, run.ok, run.shed) == (1210, 2.0, 1000, 200)
    assert run.errors == 10 + 3  # the 500s and the socket errors; 503s are documented
    assert (run.p50, run.p99, run.per_s) == (0.02, 0.04, 500.0)
    with pytest.raises(load_wrk.WrkError, match="printed no result"):
        load_wrk.WrkRun.parse("Running 2s test\n")


def test_level_figures_have_the_headline_keys_per_concurrency() -> None:
    rows = [load_report.level_figures(_level(), {1: 0.010, 3: 0.015})]
    headline = load_report.by_concurrency(rows)
    assert list(headline) == ["8"]
    assert headline["8"] == {
        "select_per_s": pytest.approx(100.0),  # 400 answered in 4 s of wrk
        "p50_ms": pytest.approx(25.0),  # the median of the visits' p50s
        "p99_ms": pytest.approx(60.0),
        "floor_per_s": pytest.approx(1000.0),
        "floor_p99_ms": pytest.approx(20.0),
        "share_of_floor": pytest.approx(0.1),
        "shed": 0.0,
        "mean_batch": 3.0,
        "errors": 3,  # the Python client's; wrk had none
    }
    assert rows[0]["client_select_per_s"] == pytest.approx(1.5)  # 3 answered in 2 s
    assert rows[0]["select_p50_ms"] == pytest.approx(25.0)  # the Python client's
    assert rows[0]["p99_over_floor_p99"] == pytest.approx(3.0)
    assert rows[0]["http_ms_per_decision"] == pytest.approx(10.0)  # 1 / (100 /s)
    assert json.loads(json.dumps(load_report.json_safe({"by_concurrency": headline})))


def test_load_refuses_to_start_without_wrk(monkeypatch, capsys) -> None:
    monkeypatch.setattr(load_wrk.shutil, "which", lambda _: None)
    assert load.main(["--seconds", "1"]) == 2
    assert "wrk is not installed: `apt-get install wrk`" in capsys.readouterr().err


def test_format_report_names_workers_threads_and_errors() -> None:
    rows = [load_report.level_figures(_level(), {1: 0.010, 3: 0.015})]
    result = {
        "workload": {"context_dim": 64, "n_arms": 10, "hidden": [100, 100], "steps": 5}
        | {"minibatch": 256},
        "database": "fresh SQLite file",
        "trainer": False,
        "device": "cpu",
        "machine": "x86_64",
        "cpus": 2,
        "threads": 1,
        "torch": "2",
        "torch_threads": 1,
        "workers": 2,
        "n_data": 20_000,
        "version": 1,
        "final_version": 1,
        "requests": 10,
        "seconds": 1.0,
        "rounds": 1,
        "warmup": 0,
        "repeats": 1,
        "reward_fraction": 0.5,
        "inproc_seconds": {1: 0.010, 3: 0.015},
        "reward_audit": None,
        "levels": rows,
    }
    report = load_report.format_report(result)
    assert "server: 2 worker process(es), torch threads 1" in report
    assert "both generators): 3" in report
    assert "floor (/v1/select/validate" in report
    assert report.index("select/s") < report.index("Python client (/select + /reward mix")
    assert "mean batch n/a" in report


def test_json_safe_replaces_nan_and_stringifies_keys() -> None:
    value = {"inproc": {1: 0.5}, "p50": math.nan, "rows": [math.inf, 2.0]}
    assert load_report.json_safe(value) == {"inproc": {"1": 0.5}, "p50": None, "rows": [None, 2.0]}


def test_load_audit_rewards_finds_lost_doubled_and_wrong_rewards(tmp_path):
    import sqlite3

    from rofu.service import migrate

    url = f"sqlite:///{tmp_path}/audit.sqlite"
    migrate.upgrade(url)
    with sqlite3.connect(tmp_path / "audit.sqlite") as db:
        for event in ("a", "b", "c", "d"):
            db.execute(
                "insert into decisions (event_id, created_at, context, candidates, arm_id, slot,"
                " propensity, model_version, explore, policy, scores, request_hash) values "
                "(?, '2026-01-01 00:00:00', '[]', '[]', 'x', 0, 1, 0, 1, 'p', '{}', 'h')",
                (event,),
            )
        for event, value in (("a", 1.0), ("b", 2.0), ("d", 4.0)):
            db.execute(
                "insert into rewards (event_id, value, received_at, repeats) values "
                "(?, ?, '2026-01-01 00:00:00', 0)",
                (event, value),
            )
    audit = load_inprocess.audit_rewards(url, {"a": 1.0, "b": 2.5, "c": 3.0})
    assert audit == {
        "acknowledged": 3,
        "stored": 3,
        "missing": 1,
        "duplicated": 0,
        "wrong_value": 1,
        "unacknowledged_stored": 1,
    }
    assert load_inprocess.audit_rewards(url, {"a": 1.0, "b": 2.0, "d": 4.0})["missing"] == 0


def test_server_share_over_the_p99_bound_comes_from_the_latency_histogram() -> None:
    def scrape(within: float, total: float) -> dict[str, float]:
        return {
            load_report.SELECT_LATENCY % "0.25": within,
            load_report.SELECT_LATENCY % "+Inf": total,
            load_report.SELECT_LATENCY.replace("/v1/select", "/v1/reward") % "+Inf": 99.0,
        }

    before, after = scrape(10.0, 10.0), scrape(207.0, 210.0)  # 200 more, 3 of them slow
    assert load_report.server_count_within(before, after, "+Inf") == 200.0
    assert load_report.server_count_within(before, after, "0.25") == 197.0
    level = _level()
    assert load_report.level_figures(level, {1: 0.010, 3: 0.015})["server_over_250ms_share"] is None
    level.server_selects, level.server_within_target = 200.0, 197.0
    row = load_report.level_figures(level, {1: 0.010, 3: 0.015})
    assert row["server_over_250ms_share"] == pytest.approx(0.015)
