"""The MLP reward network: one output per arm, or f(x, z_a) over arm features."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from rofu.models.reward_model import RewardModel
from rofu.models.validation import check_choice, check_float, check_int


def parameters_finite(module: nn.Module) -> bool:
    """Whether every parameter of `module` is finite (a diverged refit is not)."""
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def _identity(h: Tensor) -> Tensor:
    return h


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "elu": F.elu,
    "sigmoid": torch.sigmoid,
    "identity": _identity,
}


def _gelu_grad(z: Tensor, h: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.erf(z * math.sqrt(0.5))) + z * torch.exp(-0.5 * z * z) / math.sqrt(
        2.0 * math.pi
    )


#: The derivative of each activation, given its input z and its output h = act(z); used
#: by the hand-written backward passes of the ROFU estimators.
ACTIVATION_GRADS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "relu": lambda z, h: (z > 0).to(z.dtype),
    "tanh": lambda z, h: 1.0 - h * h,
    "gelu": _gelu_grad,
    "elu": lambda z, h: torch.where(z > 0, torch.ones_like(h), h + 1.0),
    "sigmoid": lambda z, h: h * (1.0 - h),
    "identity": lambda z, h: torch.ones_like(z),
}


@dataclass(frozen=True)
class RewardNetConfig:
    """Constructor arguments of a `RewardNet`; stored in every checkpoint.

    Exactly one form is chosen: `n_arms >= 1` with `arm_feature_dim == 0` gives one output
    per arm (a fixed arm set, as in the paper's experiments); `arm_feature_dim >= 1` with
    `n_arms == 0` scores f(x, z_a) from each arm's feature vector z_a, so arms can be added
    without retraining from scratch.

    `init_scale == 0` keeps PyTorch's default (Kaiming-uniform) initialisation; a positive
    value draws every weight and bias from U(-init_scale, init_scale), as the Deep Bayesian
    Bandits Showdown does (init_scale 0.3). Initialisation is deterministic in `seed`.

    `standardise` makes the network f(x) = mu_r + s_r g((x - mu_x) / s_x), the means and
    scales running statistics of the contexts and rewards it has observed (`observe`,
    Welford's), kept as buffers in its state (so in every checkpoint); `fit` trains g on
    (r - mu_r) / s_r. Off (the default) the network is g itself.
    """

    context_dim: int
    n_arms: int = 0
    hidden: tuple[int, ...] = (100, 100)
    activation: str = "relu"
    arm_feature_dim: int = 0
    bias: bool = True
    dropout: float = 0.0
    init_scale: float = 0.0
    seed: int = 0
    standardise: bool = False

    def __post_init__(self) -> None:
        check_int("context_dim", self.context_dim, low=1)
        check_int("n_arms", self.n_arms, low=0)
        check_int("arm_feature_dim", self.arm_feature_dim, low=0)
        if (self.n_arms >= 1) == (self.arm_feature_dim >= 1):
            raise ValueError(
                "exactly one of n_arms (one output per arm) and arm_feature_dim "
                f"(f(x, z_a)) must be positive, got n_arms={self.n_arms}, "
                f"arm_feature_dim={self.arm_feature_dim}"
            )
        if not isinstance(self.hidden, tuple):
            raise TypeError(f"hidden must be a tuple of ints, got {type(self.hidden).__name__}")
        for width in self.hidden:
            check_int("hidden", width, low=1)
        check_choice("activation", self.activation, ACTIVATIONS)
        for name in ("bias", "standardise"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        check_float("dropout", self.dropout, low=0.0, high=0.99)
        check_float("init_scale", self.init_scale, low=0.0)
        check_int("seed", self.seed, low=0)

    @property
    def per_arm_outputs(self) -> bool:
        """True for the one-output-per-arm form."""
        return self.n_arms >= 1

    def to_json(self) -> str:
        """Serialise to a canonical JSON string (`standardise` only when on, so a plain
        network's document is what it was before the field existed)."""
        fields = dataclasses.asdict(self)
        if not self.standardise:
            del fields["standardise"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RewardNetConfig:
        """Parse `to_json` output; raises ValueError/TypeError on a bad document."""
        raw: Any = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("network config must be a JSON object")
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"network config has unknown fields {sorted(unknown)}")
        if isinstance(raw.get("hidden"), list):
            raw["hidden"] = tuple(raw["hidden"])
        return cls(**raw)

    def build(self) -> RewardNet:
        """A freshly initialised `RewardNet` of this config."""
        return RewardNet(self)


class RewardNet(RewardModel):
    """An MLP reward model f_theta(x, a) on (D,) contexts; the exact estimator's fast
    kernel (`rofu.models.rofu_exact`) and the NTK's rank-one kernel understand its layers.

    Dropout (when `config.dropout > 0`) is applied only when a `dropout_generator` is
    passed, so every other call is deterministic and needs no train/eval switching.
    """

    stat_count: Tensor  # buffers of a standardising network (`observe`)
    x_mean: Tensor
    x_m2: Tensor
    r_mean: Tensor
    r_m2: Tensor

    def __init__(self, config: RewardNetConfig) -> None:
        super().__init__(
            (config.context_dim,), n_arms=config.n_arms, arm_feature_dim=config.arm_feature_dim
        )
        self.config = config
        widths = [config.context_dim + config.arm_feature_dim, *config.hidden]
        out_dim = config.n_arms if config.per_arm_outputs else 1
        self.layers: list[nn.Linear] = nn.ModuleList(  # type: ignore[assignment]
            nn.Linear(w_in, w_out, bias=config.bias)
            for w_in, w_out in zip(widths, [*widths[1:], out_dim], strict=True)
        )
        self.activation = ACTIVATIONS[config.activation]
        if config.standardise:  # Welford's count, means and summed squared deviations
            d = config.context_dim
            for name, width in (("stat_count", 1), ("x_mean", d), ("x_m2", d)):
                self.register_buffer(name, torch.zeros(width))
            self.register_buffer("r_mean", torch.zeros(1))  # (1,): safetensors stores no 0-d
            self.register_buffer("r_m2", torch.zeros(1))
        self.reset_parameters()

    def observe(self, x: Tensor, rewards: Tensor) -> None:
        """Fold (N, D) contexts and (N,) rewards into the running statistics (Chan et
        al.'s batch form of Welford's update); a no-op unless `config.standardise`."""
        if not self.config.standardise or x.shape[0] == 0:
            return
        with torch.no_grad():
            n_old, n_new = self.stat_count.clone(), float(x.shape[0])
            total = n_old + n_new
            pairs = ((x, self.x_mean, self.x_m2), (rewards[:, None], self.r_mean, self.r_m2))
            for data, mean, m2 in pairs:
                data = data.to(mean)
                batch_mean = data.mean(dim=0)
                delta = batch_mean - mean
                m2 += (data - batch_mean).square().sum(
                    dim=0
                ) + delta.square() * n_old * n_new / total
                mean += delta * n_new / total
            self.stat_count.fill_(float(total))

    def context_moments(self) -> tuple[Tensor, Tensor]:
        """(mu_x, s_x), each (D,): zeros and ones unless standardising."""
        ones = torch.ones(self.config.context_dim)
        if not self.config.standardise:
            return ones * 0.0, ones
        return self.x_mean, _scale(self.x_m2, self.stat_count)

    def reward_moments(self) -> tuple[Tensor, Tensor]:
        """(mu_r, s_r): 0 and 1 unless standardising."""
        if not self.config.standardise:
            return torch.zeros(()), torch.ones(())
        return self.r_mean[0], _scale(self.r_m2, self.stat_count)[0]

    def reset_parameters(self) -> None:
        """Initialise every parameter deterministically from `config.seed`."""
        generator = torch.Generator().manual_seed(self.config.seed)
        scale = self.config.init_scale
        with torch.no_grad():
            for layer in self.layers:
                bound = scale or 1.0 / math.sqrt(layer.in_features)
                if scale:
                    nn.init.uniform_(layer.weight, -scale, scale, generator=generator)
                else:
                    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
                if layer.bias is not None:
                    nn.init.uniform_(layer.bias, -bound, bound, generator=generator)

    def hidden_features(
        self, inputs: Tensor, dropout_generator: torch.Generator | None = None
    ) -> Tensor:
        """Last hidden representation of network inputs: (N, D [+F]) -> (N, H)."""
        h = inputs
        for layer in self.layers[:-1]:
            h = self.activation(layer(h))  # (N, H)
            if dropout_generator is not None and self.config.dropout > 0:
                keep = 1.0 - self.config.dropout
                mask = torch.bernoulli(
                    torch.full_like(h, keep), generator=dropout_generator
                )  # (N, H)
                h = h * mask / keep
        return h

    def inputs(self, x: Tensor, arms: Tensor, arm_features: Tensor | None) -> Tensor:
        """Network inputs of (context, arm) pairs: (N, D), (N,) -> (N, D [+F]); standardised
        contexts under `config.standardise`."""
        x = self._standardised(x)
        if self.config.per_arm_outputs:
            return x
        if arm_features is None:
            raise ValueError("arm_features is required by an arm-feature network")
        return torch.cat([x, arm_features[arms]], dim=-1)  # (N, D+F)

    def forward(
        self,
        x: Tensor,
        arms: Tensor,
        arm_features: Tensor | None = None,
        dropout_generator: torch.Generator | None = None,
    ) -> Tensor:
        """Predicted reward of each (context, arm) pair: (N, D), (N,) -> (N,)."""
        h = self.hidden_features(self.inputs(x, arms, arm_features), dropout_generator)
        out: Tensor = self._rescaled(self.layers[-1](h))  # (N, A) or (N, 1)
        if self.config.per_arm_outputs:
            return out.gather(1, arms[:, None]).squeeze(1)  # (N,)
        return out.squeeze(1)  # (N,)

    def _standardised(self, x: Tensor) -> Tensor:
        if not self.config.standardise:
            return x
        shift, scale = self.context_moments()
        return (x - shift) / scale

    def _rescaled(self, out: Tensor) -> Tensor:
        if not self.config.standardise:
            return out
        shift, scale = self.reward_moments()
        return shift + scale * out

    def score_all(
        self,
        x: Tensor,
        arm_features: Tensor | None = None,
        dropout_generator: torch.Generator | None = None,
    ) -> Tensor:
        """Predicted reward of every arm for every context: (B, D) -> (B, A)."""
        if self.config.per_arm_outputs:
            h = self.hidden_features(self._standardised(x), dropout_generator)
            scores: Tensor = self._rescaled(self.layers[-1](h))
            return scores  # (B, A)
        if arm_features is None:
            raise ValueError("arm_features is required by an arm-feature network")
        batch, n_arms = x.shape[0], arm_features.shape[0]
        arms = torch.arange(n_arms, device=x.device).repeat(batch)  # (B*A,)
        pairs = x.repeat_interleave(n_arms, dim=0)  # (B*A, D)
        return self.forward(pairs, arms, arm_features, dropout_generator).view(batch, n_arms)


def _scale(m2: Tensor, count: Tensor) -> Tensor:
    """sqrt(m2 / count), 1 where fewer than two rows or a variance of 0 were observed."""
    variance = m2 / count.clamp_min(1.0)
    usable = (count >= 2) & (variance > 0)
    return torch.where(usable, variance.clamp_min(1e-300).sqrt(), torch.ones_like(variance))
