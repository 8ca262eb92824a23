"""Trade-off pivots of a results DataFrame and their renderers.

`summary` aggregates runs over seeds per (dataset, model, defense, attack): utility, leakage
metrics present in the results, and accuracy drop against the `none` defense of the same slice.
"""

from __future__ import annotations

from typing import Any

GROUP = ["dataset", "model", "defense", "attack"]
HIGHER_IS_BETTER = {"test_acc": True, "test_loss": False}
LEAKAGE_METRICS = ("psnr", "psnr_worst", "ssim", "ssim_worst", "mse", "lpips", "label_acc", "recovered")


def summary(frame) -> Any:
    """Mean/std over seeds per configuration, with `acc_drop` vs `none` in the same slice."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame(columns=[*GROUP, "runs", "test_acc", "test_acc_std", "acc_drop"])
    ok["attack"] = ok["attack"].fillna("")
    metrics = (
        ["test_acc"]
        + [m for m in LEAKAGE_METRICS if m in ok.columns]
        + (["epsilon"] if "epsilon" in ok.columns else [])
    )
    agg = ok.groupby(GROUP, sort=False)[metrics].agg(["mean", "std"])
    table = pd.DataFrame({"runs": ok.groupby(GROUP, sort=False).size()})
    for m in metrics:
        table[m] = agg[(m, "mean")]
        table[f"{m}_std"] = agg[(m, "std")]
    table = table.reset_index()
    base = table[table["defense"] == "none"].set_index(["dataset", "model"])["test_acc"]
    base = base.groupby(level=[0, 1]).max()
    table["acc_drop"] = [
        (base.get((d, m)) - a) if (d, m) in base.index else float("nan")
        for d, m, a in zip(table["dataset"], table["model"], table["test_acc"], strict=True)
    ]
    return table


def render_rich(table) -> Any:
    """A rich Table of `summary` output: accuracy (mean ± std), drop vs none, leakage columns."""
    import math

    from rich.table import Table

    out = Table(title="accuracy per defense (mean ± std over seeds)", title_justify="left")
    cols = ["dataset", "model", "defense", "attack", "runs", "test_acc ↑", "acc_drop ↓"]
    leak = [m for m in LEAKAGE_METRICS if m in table.columns]
    for c in cols + leak:
        out.add_column(
            c, justify="right" if c not in GROUP else "left", overflow="fold" if c in GROUP else "ellipsis"
        )

    def pm(mean: float, std: float, scale: float = 1.0, digits: int = 2) -> str:
        if mean is None or (isinstance(mean, float) and math.isnan(mean)):
            return "—"
        text = f"{mean * scale:.{digits}f}"
        if std is not None and not (isinstance(std, float) and math.isnan(std)):
            text += f" ± {std * scale:.{digits}f}"
        return text

    for _, r in table.iterrows():
        cells = [
            r["dataset"],
            r["model"],
            r["defense"],
            r["attack"] or "—",
            str(int(r["runs"])),
            pm(r["test_acc"], r["test_acc_std"], 100, 1) + "%",
            pm(r["acc_drop"], None, 100, 1),
        ]
        cells += [pm(r[m], r[f"{m}_std"]) for m in leak]
        out.add_row(*cells)
    return out
