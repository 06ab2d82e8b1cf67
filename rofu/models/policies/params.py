"""The neural policies' own hyper-parameters: frozen dataclasses that validate themselves.

Each policy takes one of these as `params` (`RofuPolicy` takes `rofu.models.rofu.RofuConfig`);
None means the policy's defaults. Every error names the offending argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from rofu.models.validation import check_choice, check_float, check_int

NEURALUCB_Z = ("diag", "full", "auto")


@dataclass(frozen=True, kw_only=True)
class EpsilonGreedyParams:
    """EpsilonGreedy's exploration rate.

    Attributes:
        epsilon: probability of a uniform candidate instead of the argmax (0: Greedy).
    """

    epsilon: float = 0.05

    def __post_init__(self) -> None:
        check_float("epsilon", self.epsilon, low=0.0, high=1.0)


@dataclass(frozen=True, kw_only=True)
class NeuralUCBParams:
    """Defaults are the official code's (uclaml/NeuralUCB).

    Attributes:
        lam: lambda, the ridge of Z = lam I + sum g g^T.
        nu: scales the bonus sqrt(lam * nu * g^T Z^{-1} g).
        z: `diag` keeps Z's diagonal (the official code); `full` the P x P inverse;
            `auto` is full up to `full_max_params` parameters.
        full_max_params: the largest network `auto` keeps the full inverse for.
    """

    lam: float = 1e-3
    nu: float = 1.0
    z: str = "diag"
    full_max_params: int = 2000

    def __post_init__(self) -> None:
        check_float("lam", self.lam, low=0.0, low_open=True)
        check_float("nu", self.nu, low=0.0)
        check_choice("z", self.z, NEURALUCB_Z)
        check_int("full_max_params", self.full_max_params, low=0)


@dataclass(frozen=True, kw_only=True)
class ThompsonParams:
    """What the Thompson policies that re-sample their propensity share.

    Attributes:
        propensity_samples: extra posterior draws per decision to estimate its propensity
            (0 skips them; the propensity is then 1.0, uninformative).
    """

    propensity_samples: int = 32

    def __post_init__(self) -> None:
        check_int("propensity_samples", self.propensity_samples, low=0)


@dataclass(frozen=True, kw_only=True)
class NeuralLinearParams(ThompsonParams):
    """The Showdown's defaults.

    Attributes:
        a0, b0: the inverse-gamma prior of the noise variance.
        lambda_prior: the precision of the weights' prior.
    """

    a0: float = 6.0
    b0: float = 6.0
    lambda_prior: float = 0.25

    def __post_init__(self) -> None:
        check_float("a0", self.a0, low=0.0, low_open=True)
        check_float("b0", self.b0, low=0.0, low_open=True)
        check_float("lambda_prior", self.lambda_prior, low=0.0, low_open=True)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class DropoutParams(ThompsonParams):
    """The Showdown's default keep probability.

    Attributes:
        keep_prob: each hidden unit's probability to be kept (the network's dropout is
            1 - keep_prob), in training and in every decision.
    """

    keep_prob: float = 0.8

    def __post_init__(self) -> None:
        check_float("keep_prob", self.keep_prob, low=0.01, high=1.0)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class ParamNoiseParams(ThompsonParams):
    """The Showdown's defaults; the policy adapts `noise_std` and `eps` as it runs.

    Attributes:
        noise_std: the initial standard deviation of the weight noise.
        eps: the initial epsilon of the noise adaptation's KL target.
        d_samples: stored contexts the KL is measured on after each refit.
    """

    noise_std: float = 0.05
    eps: float = 0.1
    d_samples: int = 300

    def __post_init__(self) -> None:
        check_float("noise_std", self.noise_std, low=0.0)
        check_float("eps", self.eps, low=0.0, high=1.0, low_open=True)
        check_int("d_samples", self.d_samples, low=1)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class BootstrapParams:
    """The Showdown's defaults (`BootRMS`).

    Attributes:
        q: networks in the ensemble.
        p: each row's probability to be in a network's bootstrap sample.
    """

    q: int = 3
    p: float = 0.95

    def __post_init__(self) -> None:
        check_int("q", self.q, low=1)
        check_float("p", self.p, low=0.0, high=1.0, low_open=True)


@dataclass(frozen=True, kw_only=True)
class SquareCBParams:
    """SquareCB's learning-rate scale.

    Attributes:
        gamma0: gamma_t = gamma0 * sqrt(A * t), in inverse reward units (0: uniform).
    """

    gamma0: float = 1.0

    def __post_init__(self) -> None:
        check_float("gamma0", self.gamma0, low=0.0)


@dataclass(frozen=True, kw_only=True)
class NeuralLinUCBParams:
    """LinUCB's defaults (Li et al. 2010) on the network's last hidden layer.

    Attributes:
        alpha: scales the bonus alpha * sqrt(phi^T A_a^{-1} phi) (0: Greedy).
        ridge: lambda of A_a = lambda I + sum phi phi^T.
    """

    alpha: float = 1.0
    ridge: float = 1.0

    def __post_init__(self) -> None:
        check_float("alpha", self.alpha, low=0.0)
        check_float("ridge", self.ridge, low=0.0, low_open=True)
