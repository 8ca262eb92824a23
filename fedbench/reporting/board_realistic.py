"""The realistic-protocol column of an inversion board (issue 30): does each attack still work in
realistic federated training, measured beside the textbook setting the board ranks defenses in?

Why: the inversion boards attack the easiest case (an MLP's round-0 gradient of one record, or five
local steps on one record). The field disputes exactly whether the attacks survive practical FL:
"Privacy attack in FL is not easy" (arXiv 2409.19301) and the gradient-leakage SoK (arXiv 2404.05403)
say they fail under local training on real client datasets; FedLeak (arXiv 2506.08435) says they work.
A board answers with numbers on its own data: a companion preset (`[grid.board] realistic = "PRESET"`)
runs every attack of the board's suite that applies to an update, without a defense, on a FedAvg
federation of non-IID clients holding dozens of records each, one or more local epochs of B >= 8, at
three checkpoints of the same training (`observe_round`: untrained, early and converged).

For each attack, this module puts the textbook success rate (the board's `none` row: the attack's
per-input primary metric, e.g. re-identification) beside its realistic rates, each k / n with its exact
(Clopper-Pearson) 95 % interval over the attacked records, plus the worst case over the suite per record
and the floor (the same test on the class-mean image: what a guess that needs no attack achieves).

The verdict of the "works in realistic FL?" column (`verdict`), taken at the attack's best checkpoint:
- "yes": the interval's lower bound is at least 50 % (most records are recovered, with confidence);
- "no": at no checkpoint does the interval's lower bound exceed the floor's rate (indistinguishable
  from guessing the class-mean image);
- "partly": in between (above the floor, not a majority).
The record is `Board.realistic` (board.json); `leaderboard realistic` and `leaderboard build` write it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.reporting.board_build import plugin_name
from fedbench.reporting.intervals import clopper_pearson

MAJORITY = 0.5  # "yes": the rate's lower bound reaches it
FLOOR_COLUMN = "reid_floor"  # the class-mean guess, per input, beside the primary `reid`


def rate(values: Sequence[float]) -> dict[str, Any] | None:
    """k / n of 0/1 per-input values with its exact 95 % interval; None without inputs."""
    n = len(values)
    if not n:
        return None
    k = int(round(sum(float(v) for v in values)))
    low, high = clopper_pearson(k, n)
    return {"k": k, "n": n, "rate": round(k / n, 6), "low": round(low, 6), "high": round(high, 6)}


def checkpoint_names(rounds: Sequence[int], last: int) -> list[str]:
    """'untrained' for round 0, 'converged' for the training's last round, 'early' between."""
    return ["untrained" if r == 0 else "converged" if r == last else "early" for r in rounds]


def verdict(checkpoints: Sequence[dict[str, Any] | None], floor: Sequence[dict[str, Any] | None]) -> str:
    """The "works in realistic FL?" answer from the checkpoints' rates and floors (module docstring)."""
    pairs = [(c, f) for c, f in zip(checkpoints, floor, strict=True) if c is not None]
    if not pairs:
        return "n/a"
    if max(c["low"] for c, _ in pairs) >= MAJORITY:
        return "yes"
    if all(f is not None and c["low"] <= f["rate"] for c, f in pairs):
        return "no"
    return "partly"


def _per_input(
    frame, per_image: dict[str, dict[str, list]], *columns: str
) -> list[dict[tuple, dict[int, list]]]:
    """Per column: (attack label, round) -> seed -> the run's per-input values (victims in run order),
    all columns read in one pass over the runs."""
    out: list[dict[tuple, dict[int, list]]] = [defaultdict(dict) for _ in columns]
    for _, row in frame.iterrows():
        scores = per_image.get(row["run_id"]) or {}
        key = (str(row["attack"]), int(row["sc_observe_round"]))
        for table, column in zip(out, columns, strict=True):
            if (values := scores.get(column)) is not None:
                table[key][int(row["seed"])] = [float(v) for v in values]
    return out


def _flat(by_seed: dict[int, list]) -> list[float]:
    return [v for s in sorted(by_seed) for v in by_seed[s]]


def _textbook(none_entry: dict[str, Any] | None, primary: str) -> dict[str, dict[str, Any] | None]:
    """The board's `none` row per attack label: label -> its rate on the board."""
    out: dict[str, dict[str, Any] | None] = {}
    for label, seeds in ((none_entry or {}).get("per_input") or {}).items():
        values = [v for s in sorted(seeds, key=int) for v in seeds[s].get("values", {}).get(primary, [])]
        out[label] = rate(values)
    return out


def textbook_label(label: str, board_labels: Sequence[str]) -> str:
    """The board's attack a realistic attack stands beside: the same label, else the first of the same
    plugin (the budgets may differ; the table names both), else none ('')."""
    if label in board_labels:
        return label
    return next((b for b in board_labels if plugin_name(b) == plugin_name(label)), "")


def _worst(by_attack: list[dict[int, list]]) -> list[float]:
    """Per input, the best any attack did (inputs aligned by seed and position)."""
    seeds = sorted({s for a in by_attack for s in a})
    out: list[float] = []
    for s in seeds:
        runs = [a[s] for a in by_attack if s in a]
        if len({len(r) for r in runs}) != 1:
            raise FedbenchError(f"seed {s}: the attacks scored different numbers of inputs; rerun the preset")
        out += [max(col) for col in zip(*runs, strict=True)]
    return out


def realistic_record(
    results: Any, primary: str, none_entry: dict[str, Any] | None, preset: str, command: str, description: str
) -> dict[str, Any]:
    """The realistic-protocol record of a board from the companion preset's `results` (a `ResultSet`
    of `none` runs at several `observe_round`s) and the board's `none` entry (the textbook rates)."""
    frame = results.frame
    ok = frame[(frame["status"] == "ok") & (frame["attack"] != "")]
    if ok.empty:
        raise FedbenchError(f"preset {preset}: no successful attack runs for the realistic protocol")
    if set(ok["defense"]) != {"none"}:
        raise FedbenchError(f"preset {preset}: the realistic protocol runs without a defense (-D none only)")
    rounds = sorted({int(r) for r in ok["sc_observe_round"]})
    last = int(ok["sc_rounds"].iloc[0]) - 1
    values, floors = _per_input(ok, results.per_image, primary, FLOOR_COLUMN)
    names = list(dict.fromkeys(str(a) for a in ok["attack"]))
    textbook = _textbook(none_entry, primary)
    floor = [rate(_flat(next((floors[(a, r)] for a in names if (a, r) in floors), {}))) for r in rounds]
    attacks = []
    for name in names:
        cps = [rate(_flat(values.get((name, r), {}))) for r in rounds]
        attacks.append(
            {
                "attack": plugin_name(name),
                "label": name,
                "textbook_label": (beside := textbook_label(name, list(textbook))),
                "textbook": textbook.get(beside),
                "checkpoints": cps,
                "works": verdict(cps, floor),
            }
        )
    worst = [rate(_worst([values[(a, r)] for a in names if (a, r) in values])) for r in rounds]
    accs = ok.drop_duplicates("seed")["test_acc"].astype(float)
    sc = ok.iloc[0]
    return {
        "preset": preset,
        "command": command,
        "description": description,
        "primary": primary,
        "rounds": rounds,
        "checkpoints": checkpoint_names(rounds, last),
        "seeds": sorted({int(s) for s in ok["seed"]}),
        "scenario": {
            k[3:]: (v.item() if hasattr(v, "item") else v)
            for k, v in sc.items()
            if k.startswith("sc_") and k not in ("sc_observe_round", "sc_victim") and _present(v)
        }
        | {"dataset": str(sc["dataset"]), "model": str(sc["model"])},
        "test_acc": round(float(accs.mean()), 6) if accs.notna().any() else None,
        "attacks": attacks,
        "worst": {
            "textbook": _textbook_worst(none_entry, primary),
            "checkpoints": worst,
            "works": verdict(worst, floor),
        },
        "floor": floor,
    }


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def _textbook_worst(none_entry: dict[str, Any] | None, primary: str) -> dict[str, Any] | None:
    """The board's `none` row worst case per input over its whole suite (the board's primary)."""
    per_attack = [
        {int(seed): rec.get("values", {}).get(primary, []) for seed, rec in seeds.items()}
        for seeds in ((none_entry or {}).get("per_input") or {}).values()
    ]
    return rate(_worst(per_attack)) if per_attack else None


# ------------------------------------------------------------------------------------------ rendering


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    return f"{100 * r['rate']:.0f} % [{100 * r['low']:.0f}, {100 * r['high']:.0f}] ({r['k']}/{r['n']})"


def _row(first: str, textbook: dict[str, Any] | None, cells: Sequence[Any], works: str) -> list[str]:
    return [first, _cell(textbook) if textbook else "", *map(_cell, cells), works]


def _named(attack: dict[str, Any]) -> str:
    """The attack's label, with the board's when the board ran it at other parameters."""
    board = attack.get("textbook_label") or ""
    return attack["label"] + (f" (board: {board})" if board and board != attack["label"] else "")


def realistic_table(record: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """What was run (a paragraph), the table's headers and its rows: one per attack (textbook beside
    realistic), then the worst case per record and the floor. The README and the site render it."""
    worst = record["worst"]
    heads = [f"{name}, round {r}" for name, r in zip(record["checkpoints"], record["rounds"], strict=True)]
    headers = ["attack", "textbook (this board's `none`)", *heads, "works in realistic FL?"]
    rows = [
        *(_row(_named(a), a["textbook"], a["checkpoints"], a["works"]) for a in record["attacks"]),
        _row(
            "*any attack (worst case per record)*",
            worst.get("textbook"),
            worst["checkpoints"],
            worst.get("works", ""),
        ),
        _row("*class-mean guess (floor)*", None, record["floor"], ""),
    ]
    acc = record.get("test_acc")
    intro = (
        f"{record['description']}"
        + (f" Final test accuracy {100 * acc:.1f} %." if acc is not None else "")
        + f" No defense; seeds {', '.join(map(str, record['seeds']))}; `{record['command']}`."
        " The attacker reads a victim client's round update at each checkpoint. Each cell: the share of"
        f" the attacked records the attack re-identifies ({record['primary']}), k/n, with its exact 95 %"
        " interval. Works: yes when the best checkpoint's lower bound is at least 50 %; no when no"
        " checkpoint's lower bound exceeds the floor (the class-mean guess); partly otherwise. The textbook"
        " column is this board's own scenario and budgets."
    )
    return intro, headers, rows


def realistic_markdown(record: dict[str, Any]) -> str:
    """The README section's body: what was run, then the table of `realistic_table`."""
    intro, headers, rows = realistic_table(record)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *(" | ".join(["", *row, ""]).strip() for row in rows),
    ]
    return intro + "\n\n" + "\n".join(lines)
