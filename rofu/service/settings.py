"""One settings object, read from `ROFU_*` environment variables and an optional TOML file.

Precedence: constructor arguments > environment > the TOML file named by `ROFU_CONFIG_FILE`
> defaults. The defaults are the embedded demo: SQLite file, in-process bus and trainer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rofu.client.schemas import ARM_ID_PATTERN
from rofu.models import FitConfig, RewardNetConfig, RofuConfig
from rofu.models.checkpoint import checkpoint_size_estimate
from rofu.models.learners import LEARNERS, candidates
from rofu.models.presets import PRESETS, PRODUCT, get_preset
from rofu.service.derived import optional_settings
from rofu.service.preset_settings import (
    FIT_PART,
    MODEL_PARTS,
    ROFU_PART,
    ModelSettings,
    family_learners,
    preset_settings,
)
from rofu.service.settings_checks import check_consistent

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class ArmSpec(BaseModel):
    """An arm of the catalogue: its id and, for an arm-feature network, its features."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=ARM_ID_PATTERN)]
    features: list[FiniteFloat] | None = None


def _demo_arms() -> list[ArmSpec]:
    return [ArmSpec(id=f"arm-{i}") for i in range(4)]


class Settings(ModelSettings):
    """Every setting of the service, the trainer and the CLI."""

    model_config = SettingsConfigDict(env_prefix="ROFU_", extra="forbid", frozen=True)

    mode: Literal["embedded", "production"] = "embedded"
    database_url: str = "sqlite:///var/rofu.sqlite"
    redis_url: str | None = None
    redis_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")] = "rofu"
    # Redis is a fast path (the database holds every checkpoint): each call to it gives up
    # after this (connecting, sending, each reply); after a timeout, Redis is skipped for
    # a cool-down.
    redis_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 0.5
    checkpoint_dir: Path | None = None
    data_dir: Path | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000

    # The decision problem and the reward network.
    context_dim: Annotated[int, Field(ge=1, le=100_000)] = 8
    arms: list[ArmSpec] = Field(default_factory=_demo_arms)
    arm_feature_dim: Annotated[int, Field(ge=0)] = 0
    max_arms: Annotated[int, Field(ge=1, le=100_000)] = 64
    # Named features (rofu.service.deciding.features) are hashed into context_dim (and per-request
    # arm features into arm_feature_dim) by MurmurHash3 seeded with this. Checkpoints
    # record it; a replica refuses one trained with another seed.
    feature_hash_seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    # ROFU's preset (rofu.models.presets): the network, estimator and learner settings below
    # default to it; one set explicitly overrides it. `product` is what the replay validated.
    preset: str = PRODUCT.name
    hidden: tuple[int, ...] = PRODUCT.hidden
    activation: Literal["relu", "tanh", "gelu", "elu", "sigmoid", "identity"] = "relu"
    init_scale: Annotated[float, Field(ge=0, allow_inf_nan=False)] = PRODUCT.init_scale
    seed: Annotated[int, Field(ge=0)] = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # torch's intra-op threads per process (API and trainer); 0: torch's default.
    torch_threads: Annotated[int, Field(ge=0, le=1024)] = 0

    # ROFU's estimator and selection rule (RofuConfig: steps, step_size, ..., estimator,
    # selection, exploration_floor, igw_gamma, stability_cap) and the refit's optimizer
    # (FitConfig, as fit_batch_size, fit_optimizer, fit_lr, ...) are derived from their
    # dataclasses (`MODEL_PARTS`), bounds included; `none` (or `off`) sets an optional one
    # to None (a stability_cap of None: the fixed step).

    # With `exact` on a CUDA device: replay the estimator from CUDA graphs captured per
    # batch-size bucket (rofu.models.rofu_graphs); false: launch its kernels one by one.
    cuda_graphs: bool = True

    # API keys (Authorization: Bearer <key>). Client keys: /select, /reward and reads;
    # admin keys: catalogue changes and /admin. Files hold one key per line.
    api_keys: list[SecretStr] = Field(default_factory=list)
    api_keys_file: Path | None = None
    admin_api_keys: list[SecretStr] = Field(default_factory=list)
    admin_api_keys_file: Path | None = None

    # Input bounds: larger magnitudes are refused (422) so that no value can push the
    # network's training out of floating-point range. Scale features to match.
    max_abs_feature: Annotated[float, Field(gt=0, le=1e30, allow_inf_nan=False)] = 1e6
    max_abs_reward: Annotated[float, Field(gt=0, le=1e30, allow_inf_nan=False)] = 1e6

    # Micro-batching and request limits.
    batch_max_size: Annotated[int, Field(ge=1, le=4096)] = 64
    batch_max_wait_ms: Annotated[float, Field(ge=0, le=1000)] = 2.0
    # The most /select requests (the Personalizer facade's Rank included) a process holds:
    # queued for the micro-batcher or in the batch being scored and stored. One more is a
    # 503 with Retry-After at once. None: 4 x batch_max_size (`select_queue_limit`).
    select_queue_max: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_body_bytes: Annotated[int, Field(ge=256)] = 256 * 1024

    # The API's documentation: `open` serves /docs, /redoc and /openapi.json to anyone;
    # `key`: /openapi.json needs a client API key and the browser pages are off (a browser
    # cannot send the key); `off`: none of them. `auto`: open in embedded mode, key in
    # production.
    docs: Literal["auto", "open", "key", "off"] = "auto"

    # Bounded waits on the database (rofu.service.db.engine.DatabaseLimits): past any of them
    # a request gets a 503 with Retry-After. The readiness probe (a read, and a write that
    # is rolled back) answers within readyz_timeout_seconds, and fails once the process's
    # writes have failed for longer than readyz_write_failure_seconds.
    db_pool_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    db_connect_timeout_seconds: Annotated[int, Field(ge=1, le=600)] = 5
    db_statement_timeout_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 5_000
    db_lock_timeout_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 2_000
    sqlite_busy_timeout_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 5_000
    readyz_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 2.0
    readyz_write_failure_seconds: Annotated[float, Field(ge=0, le=3600)] = 5.0
    # The longest a /select or /reward waits for its database work, whatever the server
    # does (a frozen one enforces none of the timeouts above): then a 503. The work may
    # still finish; a retry with the same event_id then finds it, never a second copy.
    request_deadline_seconds: Annotated[float, Field(gt=0, le=600)] = 15.0
    # When /select answers, its decision is stored: `flush` on stable storage (it survives
    # a power loss; one fsync per micro-batch), `process` durable across a crash of the
    # rofu process but not of the machine (SQLite synchronous=NORMAL, Postgres
    # synchronous_commit off, for decision writes only). A reward, an activation and a
    # checkpoint are always flushed before their 2xx.
    decision_durability: Literal["flush", "process"] = "flush"

    # online: serve rofu's choice (a request's baseline_arm is only recorded); apprentice:
    # serve the app's baseline_arm, log rofu's choice beside it, learn from the baseline's
    # rewards (rofu.service.deciding.apprentice).
    learning_mode: Literal["online", "apprentice"] = "online"
    # The holdout: this share of units (a request's unit_id, else each request) is served
    # by the control (its baseline_arm, else uniform), never trained on, and compared with
    # rofu by GET /v1/report; another salt reshuffles the units (rofu.service.deciding.holdout).
    holdout_share: Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False)] = 0.0
    holdout_salt: Annotated[str, Field(min_length=1, max_length=64)] = "holdout"

    # The trainer.
    embedded_trainer: bool = True
    train_every_rewards: Annotated[int, Field(ge=1)] = 50
    train_interval_seconds: Annotated[float, Field(gt=0)] = 30.0
    reward_window_seconds: Annotated[float, Field(ge=0)] = 60.0
    default_reward: FiniteFloat | None = None
    data_sample_size: Annotated[int, Field(ge=1)] = 20_000
    # For rewards that drift: train on the last training_window rewarded rows only (an
    # older row leaves the data sample and the regulariser's per-arm counts); at most
    # data_sample_size. 0: every row, through a uniform sample of data_sample_size rows.
    training_window: Annotated[int, Field(ge=0)] = PRODUCT.schedule.window
    # Each run trains fit_steps_per_row optimizer steps per new row (the preset's rate:
    # its refit's steps over its rows between refits), at most fit_max_steps; fit_steps
    # set: exactly that many per run. fit_persist: one optimizer carried across the runs
    # of a trainer process, while it continues from its own last checkpoint.
    fit_steps: Annotated[int, Field(ge=0)] | None = None
    fit_steps_per_row: Annotated[float, Field(ge=0, allow_inf_nan=False)] = (
        PRODUCT.fit_steps_per_row
    )
    fit_max_steps: Annotated[int, Field(ge=0)] = 2000
    fit_persist: bool = PRODUCT.schedule.persist
    # The candidate learners the trainer refits side by side (rofu.models.learners): each
    # scores every new row before it is refitted on it, and the one with the lowest
    # prequential squared loss is served. One name: that learner alone.
    learners: tuple[str, ...] = family_learners(PRODUCT)

    # The evaluation gate (rofu.service.lifecycle.gate; docs/operations.md): on (auto: in
    # production mode) a new checkpoint is served only once its DR lower bound on the
    # rewarded decisions made after it is >= the served model's value - gate_tolerance.
    gate: Literal["auto", "on", "off"] = "auto"
    gate_tolerance: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.05
    gate_min_rows: Annotated[int, Field(ge=2)] = 1000
    gate_window: Annotated[int, Field(ge=2)] = 2000

    trainer_metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9101  # 0: no endpoint
    startup_timeout_seconds: Annotated[float, Field(gt=0)] = 120.0

    # Replicas following the checkpoint bus.
    checkpoint_poll_seconds: Annotated[float, Field(gt=0)] = 5.0
    # The largest checkpoint blob a replica reads, from Redis or the store; a larger one is
    # refused unread. None: derived from the network's shape (`checkpoint_byte_limit`).
    max_checkpoint_bytes: Annotated[int, Field(ge=1)] | None = None
    arm_refresh_seconds: Annotated[float, Field(gt=0)] = 5.0

    @model_validator(mode="before")
    @classmethod
    def _preset_defaults(cls, data: Any) -> Any:
        """Fill the settings not given explicitly from the named preset."""
        if not isinstance(data, dict):
            return data
        name = data.get("preset", PRODUCT.name)
        if name not in PRESETS:
            raise ValueError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return {**preset_settings(get_preset(name)), **data}

    @field_validator("learners")
    @classmethod
    def _known_learners(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in LEARNERS]
        if unknown or not value or len(set(value)) != len(value):
            raise ValueError(
                f"learners must name each of {', '.join(LEARNERS)} at most once, at least one, "
                f"got {list(value)}"
            )
        return value

    @field_validator("hidden")
    @classmethod
    def _positive_widths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(width < 1 for width in value):
            raise ValueError("every hidden width must be >= 1")
        return value

    @field_validator(*optional_settings(MODEL_PARTS), mode="before")
    @classmethod
    def _none(cls, value: object) -> object:
        """`none` (or `off`) sets an optional model setting to None (a preset's
        stability_cap lifted: the fixed step)."""
        if isinstance(value, str) and value.strip().lower() in ("none", "off"):
            return None
        return value

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        if not re.match(r"^(sqlite|postgresql(\+psycopg)?)://", value):
            raise ValueError("database_url must start with sqlite:// or postgresql://")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^rediss?://", value):
            raise ValueError("redis_url must start with redis:// or rediss://")
        return value

    @property
    def docs_access(self) -> Literal["open", "key", "off"]:
        """Who may read the API's documentation (`docs`, with `auto` resolved)."""
        if self.docs == "auto":
            return "key" if self.mode == "production" else "open"
        return self.docs

    @property
    def gate_on(self) -> bool:
        """Whether new checkpoints pass the evaluation gate (`gate`, `auto` resolved)."""
        return self.gate == "on" or (self.gate == "auto" and self.mode == "production")

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        check_consistent(self)  # settings that must agree with each other
        self.rofu_config()  # what only the whole config checks (a closed form's l2 > 0)
        return self

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is the embedded SQLite file."""
        return self.database_url.startswith("sqlite")

    @property
    def in_process_trainer(self) -> bool:
        """Whether each API process runs its own trainer (embedded, no Redis bus)."""
        return self.embedded_trainer and self.redis_url is None

    def net_config(self) -> RewardNetConfig:
        """The reward network every replica and the trainer build."""
        per_arm = self.arm_feature_dim == 0
        return RewardNetConfig(
            context_dim=self.context_dim,
            n_arms=self.max_arms if per_arm else 0,
            hidden=self.hidden,
            activation=self.activation,
            arm_feature_dim=self.arm_feature_dim,
            init_scale=self.init_scale,
            seed=self.seed,
        )

    def served_net_configs(self) -> tuple[RewardNetConfig, ...]:
        """The network structures a checkpoint may serve: each candidate learner's (one,
        `net_config`, for the MLP alone)."""
        return tuple(c.net for c in candidates(self.learners, self.net_config(), self.fit_config()))

    def checkpoint_byte_limit(self) -> int:
        """`max_checkpoint_bytes`, else 4 times the tensors a checkpoint of these networks
        and `data_sample_size` rows holds (`checkpoint_size_estimate`) plus 1 MiB."""
        if self.max_checkpoint_bytes is not None:
            return self.max_checkpoint_bytes
        tensors = checkpoint_size_estimate(
            self.served_net_configs(), self.data_sample_size, self.max_arms
        )
        return 4 * tensors + 2**20

    def select_queue_limit(self) -> int:
        """`select_queue_max`, else four full batches (`batch_max_size`): a replica that
        keeps up holds about two (one scored, one gathering); four means it fell behind."""
        if self.select_queue_max is not None:
            return self.select_queue_max
        return 4 * self.batch_max_size

    def rofu_config(self) -> RofuConfig:
        """The ROFU estimator's hyper-parameters and selection rule."""
        return dataclasses.replace(get_preset(self.preset).rofu, **ROFU_PART.read(self))

    def fit_config(self, new_rows: int = 0) -> FitConfig:
        """How a trainer run that adds `new_rows` rows refits theta_t from theta_{t-1}."""
        steps = self.fit_steps
        if steps is None:
            steps = min(self.fit_max_steps, math.ceil(self.fit_steps_per_row * new_rows))
        fit = get_preset(self.preset).schedule.fit
        return dataclasses.replace(fit, steps=steps, **FIT_PART.read(self))

    def model_config_record(self) -> dict[str, Any]:
        """The configuration a checkpoint records: the preset and what was served of it."""
        return {
            "preset": self.preset,
            "net": dataclasses.asdict(self.net_config()),
            "rofu": dataclasses.asdict(self.rofu_config()),
            "fit": dataclasses.asdict(self.fit_config()) | {"steps": self.fit_steps},
            "fit_steps_per_row": self.fit_steps_per_row,
            "fit_max_steps": self.fit_max_steps,
            "fit_persist": self.fit_persist,
            "learners": list(self.learners),
            "feature_hash_seed": self.feature_hash_seed,
        }

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Add the TOML file named by ROFU_CONFIG_FILE below the environment."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("ROFU_CONFIG_FILE")
        if config_file:
            path = Path(config_file)
            if not path.is_file():
                raise ValueError(f"ROFU_CONFIG_FILE={config_file} is not a readable file")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
