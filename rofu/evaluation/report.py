"""The report of `rofu evaluate`: evaluate.json (the figures), evaluate.md (a table) and
evaluate.png (each policy's estimates with their intervals)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rofu.evaluation.baseline import BEATS
from rofu.replay.ope import Estimate

ESTIMATORS = ("ips", "snips", "dr", "dm")
LABELS = {"ips": "IPS", "snips": "SNIPS", "dr": "DR", "dm": "DM, reward model"}


def jsonable(value: Any) -> Any:
    """Estimates as dicts, NaN as null, recursively."""
    if isinstance(value, Estimate):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def write_report(figures: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Write evaluate.json, evaluate.md and evaluate.png; returns the JSON figures."""
    data = jsonable(figures)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evaluate.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "evaluate.md").write_text(markdown(data))
    plot(data, out_dir / "evaluate.png")
    return data  # type: ignore[no-any-return]


def _cell(estimate: dict[str, Any]) -> str:
    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    return f"{fmt(estimate['value'])} [{fmt(estimate['ci_low'])}, {fmt(estimate['ci_high'])}]"


def _moment(text: str | None) -> str:
    return "n/a" if text is None else text[:19].replace("T", " ")


def _support(result: dict[str, Any]) -> str:
    share = result["support"]
    if share is None:
        return "unknown"
    partial = (
        "" if result["support_rows"] == result["rows"] else f" (on {result['support_rows']} rows)"
    )
    return f"{share:.1%}{partial}"


def _row(name: str, result: dict[str, Any]) -> str:
    cells = [
        name,
        str(result["rows"]),
        f"{_moment(result['first'])} to {_moment(result['last'])}",
        _support(result),
        *(result["refused"] if result[e] is None else _cell(result[e]) for e in ESTIMATORS[:3]),
        _cell(result["dm"]),
        f"{result['effective_rows']:.0f}",
        result["note"],
    ]
    return "| " + " | ".join(cells) + " |"


def _served(data: dict[str, Any]) -> str:
    served = data["served"]
    if served is None:
        return "No checkpoint is stored: uniform alone is evaluated."
    config = served["config"]
    source = (
        "the configuration it recorded"
        if config["source"] == "checkpoint"
        else "this shell's settings (it recorded none)"
    )
    igw = f", gamma {config['igw_gamma']:g}" if config["selection"] == "igw" else ""
    return (
        f"Served: checkpoint v{served['version']}, stored at {_moment(served['created_at'])}, "
        f"scored under {source}: {config['selection']}{igw}, floor "
        f"{config['exploration_floor']:g}, bonus x{config['bonus_scale']:g} "
        f"({config['estimator']})."
    )


def _rows(data: dict[str, Any]) -> str:
    reference = data["reference"]
    used = (
        f"{reference['rows']} rows, decided {_moment(reference['first'])} to "
        f"{_moment(reference['last'])}"
    )
    if data["include_training_rows"]:
        return f"Rows: every row of the window for every policy ({used}); see the first line."
    return (
        "Rows: each checkpoint's policies on the rows fresh for it (decided after it was "
        "stored, consumed by no training of it or an earlier version); uniform and the "
        f"logged policy on the served checkpoint's: {used}."
    )


def markdown(data: dict[str, Any]) -> str:
    """The policy x estimator table, with the log's description and the caveats."""
    lines = [f"**{data['optimistic']}**", ""] if data.get("optimistic") else []
    window = f"from {data['since'] or 'the start'} to {data['until'] or 'now'}"
    lines += [
        "# Offline evaluation on the service's decision log",
        "",
        f"{data['rows']} rewarded decisions {window} (--since/--until; {data['unrewarded']} "
        f"without a reward and {data.get('unactivated', 0)} deferred, never activated, left "
        f"out), decided by model versions {data['logged_versions']}; 95% intervals "
        f"({data['ci']}), seed {data['seed']}.",
        "",
        _served(data),
        "",
        _rows(data) + f" Logged policy (mean reward): {_cell(data['logged'])}.",
        "",
        "| policy | rows | decided | support | IPS | SNIPS | DR | DM, reward model | "
        "effective rows | |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_row(name, result) for name, result in data["policies"].items()),
        "",
        "Support: the share of the policy's choices on arms the logging rule gave a "
        "positive probability, expected under the policy (unknown: the rows logged only "
        "the chosen arm's propensity). No logged reward shows what its other choices earn, "
        "so below a support of "
        f"{100 * data['min_support']:g}% (--min-support) IPS, SNIPS and DR are not given. DM, "
        "reward model: the policy's choices valued by the reward model (a ridge "
        "regression per arm on the context, cross-fitted), for every policy; it rests on "
        "that model alone, and its interval covers the rows' noise, not the model's error. "
        "Effective rows, (sum w)^2 / sum w^2: few mean wide intervals.",
    ]
    lines += [f"- {note}" for note in data["notes"]]
    if data.get("baseline"):
        lines += baseline_markdown(data["baseline"])
    return "\n".join(lines) + "\n"


def _bounds(bounds: list[float] | None) -> str:
    return "n/a" if bounds is None else f"[{bounds[0]:.4f}, {bounds[1]:.4f}]"


def baseline_markdown(section: dict[str, Any]) -> list[str]:
    """The comparison with the app's baseline (`rofu.evaluation.baseline`)."""
    low, high = section["reward_range"]
    lines = [
        "",
        "## rofu against the app's baseline",
        "",
        f"{section['rows']} rewarded decisions of the served checkpoint's rows carried the "
        f"app's own `baseline_arm`, {section['served']} of them served it (apprentice mode). "
        f"The baseline's value on them: {_cell(section['value'])} (its mean logged reward "
        f"where it was served). Logged rewards lie in [{low:g}, {high:g}]. Each policy is "
        "compared on its own rows (those of the table above that carried a baseline).",
        "",
        "| policy | rows | agrees with the baseline | value (DR) | difference (DR) | verdict | "
        "bounds without a reward model |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in section["policies"].items():
        agrees = "n/a" if result["agreement"] is None else f"{result['agreement']:.3f}"
        lines.append(
            f"| {name} | {result['rows']} | {agrees} | {_cell(result['value'])} | "
            f"{_cell(result['difference'])} | {result['verdict']} | "
            f"{_bounds(result['bounds'])} |"
        )
    lines += [
        "",
        "By the model version that decided, rofu's own rule as logged (what it served, or "
        "in apprentice mode would have served) against the baseline, on every row of the "
        "window (each was decided by a model that had not seen it):",
        "",
        "| version | rows | agrees | baseline | rofu (DR) | difference (DR) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for version, result in section["by_version"].items():
        lines.append(
            f"| v{version} | {result['rows']} | {result['agreement']:.3f} | "
            f"{_cell(result['baseline'])} | {_cell(result['value'])} | "
            f"{_cell(result['difference'])} | {result['verdict']} |"
        )
    beating = [f"v{v}" for v, result in section["by_version"].items() if result["verdict"] == BEATS]
    lines += [
        "",
        "rofu's own rule beat the baseline on the rows of "
        + (", ".join(beating) if beating else "no version yet")
        + ".",
        "",
        "Where the baseline was served with probability 1, no reward was logged for the "
        "arms rofu would have chosen instead: there DR rests on its reward model for those "
        "arms (fitted on the contexts where the baseline chose them), which the log cannot "
        f"check. The intervals are a bootstrap over rows ({section['bootstrap']} resamples) "
        "that refits that model on each, so they cover its noise, not a wrong form of it "
        "(a reward that is not linear in the context). IPS and SNIPS above see only "
        "the rows where a policy agrees with the baseline. The bounds need no reward model: "
        "they set the unlogged arms' rewards to the lowest, then the highest, logged reward. "
        "rofu learned from the baseline's choices meanwhile; serving its own it would have "
        "learned from other data.",
    ]
    return lines


def plot(data: dict[str, Any], path: Path) -> None:
    """Each policy's IPS, SNIPS, DR (where supported) and DM estimates with 95% intervals,
    the logged mean as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["policies"])
    figure, axis = plt.subplots(figsize=(7.5, 1.2 + 0.55 * len(names)))
    for offset, estimator in zip((-0.27, -0.09, 0.09, 0.27), ESTIMATORS, strict=True):
        ys, xs, low, high = [], [], [], []
        for i, name in enumerate(names):
            e = data["policies"][name][estimator]
            if e is not None and e["value"] is not None and e["ci_low"] is not None:
                ys.append(i + offset)
                xs.append(e["value"])
                low.append(e["value"] - e["ci_low"])
                high.append(e["ci_high"] - e["value"])
        axis.errorbar(xs, ys, xerr=[low, high], fmt="o", capsize=3, label=LABELS[estimator])
    if data["logged"]["value"] is not None:
        axis.axvline(data["logged"]["value"], color="grey", linestyle="--", label="logged")
    baseline = (data.get("baseline") or {}).get("value", {}).get("value")
    if baseline is not None:
        axis.axvline(baseline, color="black", linestyle=":", label="app's baseline")
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set(xlabel="estimated mean reward per decision (95% CI)", title="rofu evaluate")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
