"""The reference workload of the speed benchmarks (`rofu bench kernel` and `rofu bench load`):
its shape, the configuration it serves, and the FLOPs each estimator spends on it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rofu.models.presets import PRODUCT
from rofu.models.rofu_config import RofuConfig


@dataclass(frozen=True)
class Workload:
    """The reference workload: a 64-dimensional context, 10 arms, an MLP 64-100-100-10, M = 5
    ascent steps on a 256-row minibatch of |D| = 20 000 rows."""

    context_dim: int = 64
    n_arms: int = 10
    hidden: tuple[int, ...] = (100, 100)
    steps: int = 5
    minibatch: int = 256
    n_data: int = 20_000

    def widths(self) -> list[tuple[int, int]]:
        dims = [self.context_dim, *self.hidden, self.n_arms]
        return list(zip(dims[:-1], dims[1:], strict=True))

    def exact_flops(self, pairs: int, *, last_update: bool = True) -> float:
        """FLOPs of exact ROFU for `pairs` (context, arm) pairs.

        Forward costs 2 * sum(in * out) per row; backward 2 * sum(in * out) for weight
        gradients plus the same for input gradients except the first layer's. Step 1 is
        one shared minibatch gradient plus a single-row gradient per pair; steps 2..M run
        per pair over minibatch + query row; plus the forward at theta and at theta_M.
        Without `last_update` (the hand-written kernel) the last step forms no weight
        gradient: theta_M's output at the query costs 2 * sum(in + out) per row instead.
        """
        fwd = 2 * sum(i * o for i, o in self.widths())
        bwd = 2 * fwd - 2 * self.widths()[0][0] * self.widths()[0][1]
        step = fwd + bwd
        per_pair = (self.steps - 1) * (self.minibatch + 1) * step + step + 2 * fwd
        if not last_update and self.steps > 1:
            saved = fwd - 2 * sum(i + o for i, o in self.widths())  # per row
            per_pair -= (self.minibatch + 1) * saved
        return float(pairs * per_pair + (self.minibatch * step if self.steps else 0))

    def ntk_flops(self, contexts: int) -> float:
        """FLOPs of NTK-ROFU from a prepared basis: the queries' features, their kernel
        with the M x m rows, and the coefficient steps (each (P, known) x (known, m))."""
        pairs, rows, m = contexts * self.n_arms, self.steps * self.minibatch, self.minibatch
        fwd = 2 * contexts * sum(i * o for i, o in self.widths())
        bwd = 2 * pairs * sum(i * o for i, o in self.widths()[1:])
        cross = 2 * rows * sum(pairs * o + contexts * i for i, o in self.widths())
        steps = 2 * pairs * m * m * self.steps * (self.steps - 1) // 2
        return float(fwd + bwd + cross + steps)

    def served_config(self) -> RofuConfig:
        """The product preset's estimator with this workload's M and minibatch, as
        `rofu bench load` configures its server (`rofu.bench.load.server_overrides`)."""
        return dataclasses.replace(PRODUCT.rofu, steps=self.steps, minibatch_size=self.minibatch)

    def served_flops(self, contexts: int) -> float | None:
        """FLOPs of the served estimator for `contexts` contexts (None: not counted)."""
        estimator = self.served_config().estimator
        if estimator == "ntk":
            return self.ntk_flops(contexts)
        if estimator == "exact":
            return self.exact_flops(contexts * self.n_arms, last_update=False)
        return None

    def ntk_prepare_flops(self) -> float:
        """FLOPs of the basis: the rows' features and the kernel blocks between steps."""
        rows, m = self.steps * self.minibatch, self.minibatch
        per_row = 2 * sum(i * o for i, o in self.widths()) * 2
        blocks = self.steps * (self.steps - 1) // 2
        gram = blocks * m * m * 2 * sum(i + o for i, o in self.widths())
        return float(rows * per_row + gram)
