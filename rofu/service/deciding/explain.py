"""Why this arm: per scored candidate, the context features that moved its mean the most.

With `explain: true` a /select answer carries, for every candidate, the `TOP_FEATURES`
largest contributions to its estimated mean by gradient x input: for context entry i,
(d mean / d x_i) x_i, at the context as it was scored (clamped into the range the
network was trained on, `Snapshot.bounded`), through the served network (its
standardisation included). For a named context each hashed entry gets its own share,
(d mean / d x_index) x weight, under its name (`user.country=fr`, `hour`); entries that
collide in one index share its gradient. The bonus is not explained: it is the model's
uncertainty, not a feature's pull.

The gradients are computed in the batcher's worker thread with the scores, only for the
requests that ask (one backward pass per candidate arm); a replayed decision (a repeated
`event_id`) and a cold start (no model yet) carry none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rofu.client.schemas import ArmExplanation, FeatureContribution
from rofu.models.networks import RewardNet
from rofu.models.reward_model import evaluating
from rofu.service.deciding import features

#: Contributions returned per candidate, largest magnitude first.
TOP_FEATURES = 5

#: The label of the default namespace's features: their name alone.
_DEFAULT = features.DEFAULT_NAMESPACE


def mean_gradients(net: RewardNet, contexts: Tensor, tables: Sequence[Tensor | None]) -> Tensor:
    """(J, A, D) d f(x_j, a) / d x_j for every context and every output arm.

    Args:
        net: the served network.
        contexts: (J, D) the contexts as scored.
        tables: per context, the (A, F) arm features it was scored with (an arm-feature
            network), or None for a network with one output per arm.
    """
    with torch.enable_grad(), evaluating(net):
        x = contexts.detach().clone().requires_grad_(True)
        if net.config.per_arm_outputs:
            values = net.score_all(x)  # (J, A)
        else:
            values = torch.cat(
                [net.score_all(x[j : j + 1], table) for j, table in enumerate(tables)]
            )
        grads = []
        for arm in range(values.shape[1]):  # rows are independent: one pass per arm
            (grad,) = torch.autograd.grad(values[:, arm].sum(), x, retain_graph=True)
            grads.append(grad)
    return torch.stack(grads, dim=1).detach()  # (J, A, D)


def explanations(
    gradients: Tensor,
    candidates: Sequence[tuple[int, str]],
    scored: Sequence[float],
    named: Mapping[str, object] | None,
    seed: int,
) -> list[ArmExplanation]:
    """Each candidate's top contributions.

    Args:
        gradients: (A, D) one context's gradients (`mean_gradients`), by output slot.
        candidates: (slot, arm id) of each candidate, in the answer's order.
        scored: the context as scored, D floats.
        named: the request's named context, or None for a dense one.
        seed: `ROFU_FEATURE_HASH_SEED`, which the named entries were hashed with.
    """
    dim = gradients.shape[1]
    if named is None:
        labels = [f"context[{i}]" for i in range(dim)]
        index = torch.arange(dim)
        weight = torch.tensor(scored, dtype=torch.float64)
    else:
        entries = features.named_entries(named)
        labels = [_label(entry) for entry in entries]
        index = torch.tensor([entry.index(dim, seed) for entry in entries], dtype=torch.long)
        weight = torch.tensor([entry.weight for entry in entries], dtype=torch.float64)
    out = []
    for slot, arm in candidates:
        contribution = gradients[slot].double()[index] * weight  # (entries,)
        top = contribution.abs().argsort(descending=True)[:TOP_FEATURES].tolist()
        out.append(
            ArmExplanation(
                arm=arm,
                features=[
                    FeatureContribution(
                        feature=labels[k],
                        index=int(index[k]),
                        contribution=float(contribution[k]),
                    )
                    for k in top
                ],
            )
        )
    return out


def _label(entry: features.Entry) -> str:
    return entry.name if entry.namespace == _DEFAULT else f"{entry.namespace}.{entry.name}"
