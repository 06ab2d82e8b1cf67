"""Settings: sources and their precedence, validators, and the configs built from them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rofu.models import (
    Checkpoint,
    FitConfig,
    RegulariserData,
    RewardNetConfig,
    RofuConfig,
    dump_checkpoint,
)
from rofu.models.presets import PRESETS, PRODUCT
from rofu.service.settings import ArmSpec, Settings, get_settings
from tests.factories import make_transitions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ROFU_* variable of the calling shell leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rofu.toml"
    path.write_text(text)
    return path


def test_settings_defaults_are_the_embedded_demo() -> None:
    settings = Settings()
    assert settings.mode == "embedded"
    assert settings.is_sqlite
    assert settings.redis_url is None
    assert [arm.id for arm in settings.arms] == ["arm-0", "arm-1", "arm-2", "arm-3"]
    assert settings.embedded_trainer is True


def test_settings_read_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "12")
    monkeypatch.setenv("ROFU_HIDDEN", "[32, 16]")
    monkeypatch.setenv("ROFU_ARMS", '[{"id": "red"}, {"id": "blue"}]')
    monkeypatch.setenv("ROFU_EMBEDDED_TRAINER", "false")
    monkeypatch.setenv("ROFU_STEP_SIZE", "0.5")
    monkeypatch.setenv("ROFU_DATABASE_URL", "postgresql://u@db:5432/rofu")
    monkeypatch.setenv("ROFU_REDIS_URL", "redis://cache:6379/0")
    monkeypatch.setenv("CONTEXT_DIM", "99")  # unprefixed: ignored
    settings = Settings()
    assert settings.context_dim == 12
    assert settings.hidden == (32, 16)
    assert settings.arms == [ArmSpec(id="red"), ArmSpec(id="blue")]
    assert settings.embedded_trainer is False
    assert settings.step_size == 0.5
    assert settings.database_url == "postgresql://u@db:5432/rofu"
    assert not settings.is_sqlite
    assert settings.redis_url == "redis://cache:6379/0"


def test_settings_ignore_test_harness_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI exports these next to the service's own; they must not trip extra="forbid".
    monkeypatch.setenv("ROFU_REQUIRE_SERVICES", "1")
    monkeypatch.setenv("ROFU_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1/test")
    assert Settings().context_dim == 8


def test_settings_refuse_a_malformed_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "eight")
    with pytest.raises(ValidationError, match="context_dim"):
        Settings()


def test_settings_read_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(
        tmp_path,
        'context_dim = 5\nhidden = [8]\narms = [{ id = "a" }, { id = "b" }, { id = "c" }]\n'
        "reward_window_seconds = 2.5\n",
    )
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(path))
    settings = Settings()
    assert settings.context_dim == 5
    assert settings.hidden == (8,)
    assert [arm.id for arm in settings.arms] == ["a", "b", "c"]
    assert settings.reward_window_seconds == 2.5


def test_settings_precedence_constructor_then_env_then_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, "context_dim = 5\nseed = 11\nsteps = 3\n")
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(path))
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "6")
    monkeypatch.setenv("ROFU_SEED", "12")
    settings = Settings(seed=13)
    assert settings.seed == 13  # constructor beats env and file
    assert settings.context_dim == 6  # env beats file
    assert settings.steps == 3  # file beats default


def test_settings_missing_config_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere.toml"
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(missing))
    with pytest.raises(ValueError, match="ROFU_CONFIG_FILE=.*nowhere.toml.*not a readable file"):
        Settings()


def test_settings_refuse_unknown_keys_in_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(_toml(tmp_path, "contxt_dim = 5\n")))
    with pytest.raises(ValidationError, match="contxt_dim"):
        Settings()


def test_settings_load_the_shipped_demo_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(ROOT / "config" / "demo.toml"))
    settings = Settings()
    assert settings.mode == "embedded"
    assert settings.context_dim == 8
    assert settings.reward_window_seconds == 5.0


def test_settings_get_settings_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "3")
    first = get_settings()
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "4")
    assert get_settings() is first
    assert first.context_dim == 3


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError, match="frozen"):
        settings.context_dim = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arms": [{"id": "a"}, {"id": "a"}]}, "arm ids must be unique"),
        ({"arms": [{"id": f"a{i}"} for i in range(3)], "max_arms": 2}, "exceed max_arms=2"),
        (
            {"arm_feature_dim": 2, "arms": [{"id": "a", "features": [1.0]}]},
            "arm 'a' has 1 features, arm_feature_dim is 2",
        ),
        ({"arm_feature_dim": 2, "arms": [{"id": "a"}]}, "arm 'a' has 0 features"),
        ({"arms": [{"id": "a", "features": [1.0]}]}, "arm_feature_dim is 0"),
        ({"arms": [{"id": "bad id"}]}, "String should match pattern"),
        ({"database_url": "mysql://u@db/rofu"}, "database_url must start with"),
        ({"database_url": "var/rofu.sqlite"}, "database_url must start with"),
        ({"redis_url": "http://cache:6379"}, "redis_url must start with"),
        ({"hidden": (16, 0)}, "hidden width must be >= 1"),
        (
            {"mode": "production", "database_url": "sqlite:///var/rofu.sqlite"},
            "production mode needs a Postgres database_url",
        ),
        (
            {"mode": "production", "database_url": "postgresql://u@db/rofu"},
            "production mode needs redis_url",
        ),
        ({"unknown_setting": 1}, "unknown_setting"),
        ({"torch_threads": -1}, "greater than or equal to 0"),
        ({"stability_cap": 0}, "greater than 0"),
        ({"stability_cap": float("inf")}, "finite number"),
        (
            {"training_window": 500, "data_sample_size": 100},
            r"training_window \(500\) exceeds data_sample_size \(100\)",
        ),
    ],
)
def test_settings_validators_refuse(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "production", "database_url": "postgresql://u@db/r", "redis_url": "redis://c"},
        {"database_url": "postgresql+psycopg://u@db/r", "redis_url": "rediss://c:6380/1"},
        {"arm_feature_dim": 2, "arms": [{"id": "a", "features": [0.5, -1.0]}]},
        {"arms": [{"id": f"a{i}"} for i in range(3)], "max_arms": 3},
    ],
)
def test_settings_validators_accept(kwargs: dict[str, object]) -> None:
    Settings(**kwargs)  # type: ignore[arg-type]


def test_settings_torch_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().torch_threads == 0  # torch's default
    monkeypatch.setenv("ROFU_TORCH_THREADS", "1")
    assert Settings().torch_threads == 1


def test_settings_in_process_trainer_only_embedded_without_redis() -> None:
    assert Settings().in_process_trainer
    assert not Settings(embedded_trainer=False).in_process_trainer
    assert not Settings(redis_url="redis://cache:6379/0").in_process_trainer


def test_apply_torch_threads_sets_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from rofu.service.threads import apply_torch_threads

    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="rofu.threads"):
            assert apply_torch_threads(1) == 1
            assert torch.get_num_threads() == 1
            assert apply_torch_threads(0) == 1  # 0 leaves the count as it is
        assert "torch intra-op threads: 1 (ROFU_TORCH_THREADS=1)" in caplog.text
        assert "torch intra-op threads: 1 (torch's default)" in caplog.text
        with pytest.raises(ValueError, match="threads must be >= 0"):
            apply_torch_threads(-1)
    finally:
        torch.set_num_threads(before)


def test_settings_net_config_per_arm() -> None:
    settings = Settings(context_dim=7, max_arms=10, hidden=(12, 6), activation="tanh", seed=4)
    assert settings.net_config() == RewardNetConfig(
        context_dim=7, n_arms=10, hidden=(12, 6), activation="tanh", arm_feature_dim=0, seed=4
    )


def test_settings_net_config_arm_features() -> None:
    settings = Settings(
        context_dim=3, arm_feature_dim=2, arms=[{"id": "a", "features": [1.0, 2.0]}]
    )
    config = settings.net_config()
    assert config.n_arms == 0
    assert config.arm_feature_dim == 2
    assert config.context_dim == 3


def test_settings_rofu_config() -> None:
    settings = Settings(
        steps=7,
        step_size=0.05,
        step_decay=0.9,
        eta=0.5,
        regulariser="arm_count",
        l2=1.0,
        minibatch_size=64,
        bonus_scale=2.0,
        estimator="exact",
    )
    assert settings.rofu_config() == RofuConfig(
        steps=7,
        step_size=0.05,
        step_decay=0.9,
        eta=0.5,
        regulariser="arm_count",
        l2=1.0,
        minibatch_size=64,
        bonus_scale=2.0,
        estimator="exact",
        baseline="drift",  # not set: the product preset's
        stability_cap=1.0,  # likewise
        exploration_floor=0.005,  # likewise
    )


def test_settings_stability_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().rofu_config().stability_cap == 1.0  # the product preset's
    monkeypatch.setenv("ROFU_STABILITY_CAP", "0.5")
    assert Settings().rofu_config().stability_cap == 0.5
    monkeypatch.setenv("ROFU_PRESET", "small-lr")  # a preset with a cap
    monkeypatch.setenv("ROFU_STABILITY_CAP", "none")
    assert Settings().rofu_config().stability_cap is None
    monkeypatch.setenv("ROFU_STABILITY_CAP", "soon")
    with pytest.raises(ValidationError, match="stability_cap"):
        Settings()


def test_settings_serve_the_product_preset_the_replays_rofu_runs() -> None:
    """One product, one default: what the service serves is what `--policies ROFU` runs."""
    import torch

    from rofu.replay.simulation.policies import build_policy

    settings = Settings()
    assert settings.preset == "product"
    assert settings.rofu_config() == PRODUCT.rofu
    assert settings.net_config() == PRODUCT.net(8, settings.max_arms, 0)
    assert settings.fit_config(new_rows=1) == PRODUCT.schedule.fit  # 10 steps per row
    assert settings.fit_persist is PRODUCT.schedule.persist is True
    replayed = build_policy("ROFU", 8, settings.max_arms, 0, torch.device("cpu"))
    assert replayed.rofu == PRODUCT.rofu  # type: ignore[attr-defined]
    assert replayed.schedule == PRODUCT.schedule  # type: ignore[attr-defined]
    assert replayed.net.config == settings.net_config()  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="estimator"):
        Settings(estimator="fast")


@pytest.mark.parametrize("name", list(PRESETS))
def test_settings_take_a_named_preset(name: str) -> None:
    preset = PRESETS[name]
    settings = Settings(preset=name)
    assert settings.rofu_config() == preset.rofu
    assert (settings.hidden, settings.activation) == (preset.hidden, preset.activation)
    assert settings.fit_config(new_rows=1) == preset.schedule.fit
    assert settings.model_config_record()["preset"] == name


def test_settings_preset_from_the_environment_and_explicit_settings_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROFU_PRESET", "sgd-decay")
    monkeypatch.setenv("ROFU_FIT_LR", "0.05")
    settings = Settings(activation="tanh")
    assert settings.fit_config(new_rows=1) == FitConfig(
        steps=10, batch_size=256, optimizer="sgd", lr=0.05, weight_decay=1e-3
    )
    assert settings.activation == "tanh"
    with pytest.raises(ValidationError, match="unknown preset 'fancy'; known: product"):
        Settings(preset="fancy")


def test_settings_fit_config() -> None:
    settings = Settings(fit_steps=11, fit_batch_size=32, fit_optimizer="sgd", fit_lr=0.1)
    assert settings.fit_config(new_rows=500) == FitConfig(
        steps=11, batch_size=32, optimizer="sgd", lr=0.1
    )
    per_row = Settings(fit_steps_per_row=2.5, fit_max_steps=300)
    assert [per_row.fit_config(new_rows=n).steps for n in (0, 1, 7, 120, 121)] == [
        0,
        3,
        18,
        300,
        300,
    ]


def test_shipped_configurations_serve_the_product_preset_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo, compose and Kubernetes configurations override none of the preset's
    settings: what they serve is what the replay validated."""
    import yaml

    from rofu.service.settings import preset_settings

    owned = {f"ROFU_{key.upper()}" for key in preset_settings(PRODUCT)}
    monkeypatch.setenv("ROFU_CONFIG_FILE", str(ROOT / "config" / "demo.toml"))
    demo = Settings()
    assert demo.rofu_config() == PRODUCT.rofu
    assert (demo.hidden, demo.activation) == (PRODUCT.hidden, PRODUCT.activation)
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    configmap = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "configmap.yaml").read_text())
    environments = [configmap["data"], *(anchor for anchor in _env_blocks(compose))]
    for environment in environments:
        assert not owned & set(environment), sorted(owned & set(environment))
        assert environment.get("ROFU_PRESET", "product") == "product"


def _env_blocks(document: object) -> list[dict[str, object]]:
    """Every mapping of ROFU_* variables in a YAML document."""
    found: list[dict[str, object]] = []
    if isinstance(document, dict):
        if any(str(key).startswith("ROFU_") for key in document):
            found.append(document)
        for value in document.values():
            found += _env_blocks(value)
    elif isinstance(document, list):
        for value in document:
            found += _env_blocks(value)
    return found


def test_settings_checkpoint_byte_limit_is_set_or_derived_from_the_network() -> None:
    shape = {
        "context_dim": 5,
        "max_arms": 4,
        "hidden": (16,),
        "data_sample_size": 500,
        "learners": ("mlp",),
    }
    settings = Settings(**shape)
    net = settings.net_config().build()
    sample = make_transitions(500, 5, 4, dtype=torch.float64)
    data = RegulariserData(sample, 500, sample.arms.bincount(minlength=4))
    full = dump_checkpoint(Checkpoint(1, net.config, net.state_dict(), data))
    assert len(full) < settings.checkpoint_byte_limit() < 4 * len(full) + 2**20 + 2**16
    for name, value in {"data_sample_size": 5000, "learners": ("mlp", "linear")}.items():
        larger = Settings(**(shape | {name: value}))
        assert larger.checkpoint_byte_limit() > settings.checkpoint_byte_limit()
    assert Settings(max_checkpoint_bytes=4096).checkpoint_byte_limit() == 4096
    with pytest.raises(ValidationError, match="max_checkpoint_bytes"):
        Settings(max_checkpoint_bytes=0)


def test_settings_select_queue_limit_is_set_or_four_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().select_queue_limit() == 4 * 64
    assert Settings(batch_max_size=8).select_queue_limit() == 32
    assert Settings(batch_max_size=8, select_queue_max=5).select_queue_limit() == 5
    monkeypatch.setenv("ROFU_SELECT_QUEUE_MAX", "17")
    assert Settings().select_queue_limit() == 17
