"""The kernel benchmark's text report: its JSON result as a table, with each contender's
share of the fp32 matmul rate measured in the same run."""

from __future__ import annotations

from typing import Any

#: The headline rows: the product preset, as a replica prepares and scores it.
SERVED = ("served", "served_prepare", "served_explain")

#: The other contenders (other configurations, labelled as such), in report order.
CONTENDERS = (
    "naive",
    "rofu_reference",
    "rofu_reference_chunked",
    "rofu_exact",
    "rofu_exact_chunk256",
    "rofu_ntk",
    "rofu_exact_graphs",
    "neuralucb_diag",
    "greedy",
)


def format_report(result: dict[str, Any]) -> str:
    """A plain-text table of `report` output."""
    work = result["workload"]
    lines = [
        f"ROFU kernel benchmark on {result['device']} ({result['device_name']}, "
        f"{result['threads']} threads, torch {result['torch']}), median of "
        f"{result['repeats']} interleaved runs, load average "
        f"{' '.join(f'{v:.2f}' for v in result['load_average'])}",
        f"workload: D={work['context_dim']}, A={work['n_arms']}, MLP "
        f"{work['context_dim']}-{'-'.join(map(str, work['hidden']))}-{work['n_arms']}, "
        f"M={work['steps']}, minibatch={work['minibatch']}, |D|={work['n_data']}",
        f"served: the product preset ({_served(result['served'])}), prepared once as a "
        "replica prepares a checkpoint; every other ROFU row is another configuration",
        f"fp32 matmul 2048x2048: {result['matmul_gflops']:.1f} GFLOP/s",
        "",
        f"{'contexts':>8}  {'contender':<22} {'median ms':>10} {'ms/context':>11} "
        f"{'% of matmul':>12} {'floor ms':>9}",
    ]
    for batch, row in result["contexts"].items():
        lines += [_row(batch, row, name) for name in SERVED]
        lines.append(f"{'':>8}  other configurations:")
        others = (*CONTENDERS, "ntk_prepare")
        lines += [_row(batch, row, name) for name in others if f"{name}_ms" in row]
        ratios = row["ratios"]
        lines.append(
            f"{'':>8}  served/greedy = {ratios['served_over_greedy']:.1f}x, "
            f"served/rofu_ntk = {ratios['served_over_ntk']:.2f}x, "
            f"explain/served = {ratios['explain_over_served']:.2f}x"
        )
        lines.append(
            f"{'':>8}  reference/exact = {ratios['rofu_reference_over_exact']:.2f}x "
            f"(chunked reference/exact = {ratios['rofu_reference_chunked_over_exact']:.2f}x, "
            f"exact at 256/exact = {ratios['exact_chunk256_over_exact']:.2f}x), "
            f"reference/ntk = {ratios['rofu_reference_over_ntk']:.1f}x, "
            f"ntk/NeuralUCB-diag = {ratios['ntk_over_neuralucb_diag']:.2f}x, "
            f"exact/NeuralUCB-diag = {ratios['exact_over_neuralucb_diag']:.1f}x"
            + (
                f", exact/graphs = {ratios['exact_over_graphs']:.2f}x"
                if "exact_over_graphs" in ratios
                else ""
            )
        )
    near = result["closeness"]
    lines.append("")
    lines.append(
        f"NTK vs exact bonus on a partly fitted network ({near['contexts']} contexts, float64):"
    )
    for baseline in ("start", "drift"):
        c = near[baseline]
        lines.append(
            f"  {baseline:<5}: bonus relative difference median "
            f"{_percent(c['median_relative_difference'])}, p90 "
            f"{_percent(c['p90_relative_difference'])}; zero bonuses exact "
            f"{_percent(c['exact_zero_share'])}, ntk {_percent(c['ntk_zero_share'])}; "
            f"same choice {_percent(c['same_choice_share'])}"
        )
    return "\n".join(lines)


def _row(batch: str, row: dict[str, Any], name: str) -> str:
    ms = row[f"{name}_ms"]
    share = row["share_of_matmul"].get(name)
    floor = row["flop_floor_ms"].get(name)
    return (
        f"{batch:>8}  {name:<22} {ms:>10.2f} {ms / int(batch):>11.3f} "
        f"{'' if share is None else f'{100 * share:.0f}%':>12} "
        f"{'' if floor is None else f'{floor:.2f}':>9}"
    )


def _served(config: dict[str, Any]) -> str:
    keys = ("estimator", "baseline", "regulariser", "stability_cap", "noise", "selection")
    return ", ".join(f"{key} {config[key]}" for key in keys)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
