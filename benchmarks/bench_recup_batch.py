"""RecUP-FL's FGSM batched over updates (issue 29) vs one update at a time, on the attribute board's case.

The case is `registry/presets/board-attribute.toml`'s: Adult, the 103-50-2 MLP, FedSGD (lr 1, MSE),
recup-fl[eps=0.001, zoo=5, widths=64..256, epochs=30, pool_size=2000, max_features=1024] with the
paper's P = 10, Q = 5, at the global weights of round 2 (two rounds of 400 one-record clients, `none`).
The N updates are those of N records no client holds, each as a one-record client with its own hook
generator, as the adaptive adversary replays its pool (`train_on=defended`). The zoo is built once
before timing (it is shared by all clients of a round and cached) and its build time reported.

For each N, `fgsm=per-record` (one forward and backward per FGSM step and update: the path before
issue 29, run here as the baseline) and `fgsm=batched` (`update_batch` over the N updates) are timed
alternately, `--repeats` times each, in CPU time (process time: other jobs on a shared machine do not
count), at `--threads` threads; the table gives the medians per update, their ratio and its range
over the repeats, and how many of the N perturbed updates differ between the two paths. Then the zoo's
training (the other cost of a RecUP-FL run: one zoo per round) with `train_classifier` against the
`torch.optim.SGD` loop it replaced, alternating, and whether the trained weights are identical.

    python benchmarks/bench_recup_batch.py --out benchmarks/results/recup_batch.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import check, environment, markdown_table, write_json

BOARD_RECUP = {
    "attributes": ["race"],
    "eps": 1e-3,
    "zoo": 5,
    "widths": [64, 128, 256],
    "epochs": 30,
    "pool_size": 2000,
    "max_features": 1024,
}
SCENARIO = {
    "protocol": "fedsgd",
    "clients": 400,
    "participation": 0.25,
    "rounds": 2,
    "batch_size": 0,
    "lr": 1.0,
    "loss": "mse",
    "train_size": 400,
    "test_size": 2000,
}


def sgd_reference(net, features, labels, epochs: int, lr: float, batch: int, seed: int):
    """The zoo's training loop before issue 29: `torch.optim.SGD`, `zero_grad`, `backward`, `step`."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=gen)
        for i in range(0, len(labels), batch):
            idx = order[i : i + batch]
            opt.zero_grad()
            nn.functional.cross_entropy(net(features[idx]), labels[idx]).backward()
            opt.step()
    return net.eval()


def zoo_training(features, labels, n_classes: int, repeats: int) -> dict:
    """CPU seconds of training the board's zoo (5 members, 30 epochs) with `train_classifier` and with
    the `torch.optim.SGD` loop it replaced, alternating; whether the weights are identical."""
    import torch

    from fedbench.attacks import _attribute_core as core

    members = core.zoo_widths(BOARD_RECUP["zoo"], BOARD_RECUP["widths"], core.ZOO_SEED)
    times: dict[str, list[float]] = {"sgd": [], "now": []}
    nets = {}
    for r in range(repeats):
        for label in ("sgd", "now") if r % 2 == 0 else ("now", "sgd"):
            train = sgd_reference if label == "sgd" else core.train_classifier
            start = time.process_time()
            trained = []
            for i, widths in enumerate(members):
                torch.manual_seed(i)
                net = core.mlp(features.shape[1], widths, n_classes)
                trained.append(train(net, features, labels, BOARD_RECUP["epochs"], 0.01, 64, i))
            times[label].append(time.process_time() - start)
            nets[label] = trained
    same = all(
        torch.equal(a, b)
        for x, y in zip(nets["sgd"], nets["now"], strict=True)
        for a, b in zip(x.parameters(), y.parameters(), strict=True)
    )
    sgd, now = statistics.median(times["sgd"]), statistics.median(times["now"])
    return {"sgd_loop_cpu_s": sgd, "train_classifier_cpu_s": now, "speedup": sgd / now, "identical": same}


def cpu_seconds(fn) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[40, 100, 400], help="N: updates per batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each path (medians)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="N = 40 and 400, 2 repeats")
    ap.add_argument("--zoo-repeats", type=int, default=2, help="repeats of the zoo training comparison")
    ap.add_argument("--out", default=None, help="write JSON results here")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeats = [40, 400], 2
    import torch

    from fedbench import registry
    from fedbench.attacks._attribute_core import FeatureMap, layout_for, pool_updates, pool_window
    from fedbench.data import load_dataset
    from fedbench.fl.seeding import torch_generator
    from fedbench.fl.simulation import Simulation
    from fedbench.models import build_model
    from fedbench.plugin import HookContext, RunData, Scenario

    torch.set_num_threads(args.threads)
    registry.load_builtins()
    bundle = load_dataset("adult")
    sc = Scenario.from_dict(SCENARIO)
    factory = lambda: build_model("mlp", {"hidden": [50]}, (103,), 2)  # noqa: E731
    sim = Simulation(sc, bundle, factory, registry.defenses.get("none")(), seed=0)
    sim.run()
    state, model = sim.global_state, factory()
    model.load_state_dict(state)
    names = [n for n, t in model.named_parameters() if t.requires_grad]
    layout = layout_for(state, names, "all")
    n_max = max(args.sizes)
    # records no client holds: the first n_max are the updates perturbed, the zoo comparison trains on all
    start = SCENARIO["train_size"]
    pool = torch.arange(start, start + max(n_max, BOARD_RECUP["pool_size"]))
    flat = pool_updates(
        model, state, layout, bundle.x_train[pool], bundle.y_train[pool], "mse", "gradient", 1.0
    )
    deltas = [layout.unflatten(flat[i]) for i in range(n_max)]
    data = RunData(bundle, 400, 2000, tuple((int(i),) for i in pool[:n_max]), scenario=sc)
    fmap = FeatureMap(layout, pool_window(layout, BOARD_RECUP["max_features"])).fit(flat)
    with torch.no_grad():
        features = fmap(flat)
    race = bundle.attr_train["race"][pool]
    n_classes = len(bundle.meta.attribute_names["race"])

    def defense(fgsm: str):
        d = registry.defenses.get("recup-fl")({**BOARD_RECUP, "fgsm": fgsm})
        d.bind_data(data)
        return d

    paths = {"per-record": defense("per-record"), "batched": defense("batched")}

    def contexts(n: int) -> list[HookContext]:
        return [
            HookContext(
                2, c, 0, sc, torch_generator(0, "aia-defended-update", 2, c, 0), model, global_state=state
            )
            for c in range(n)
        ]

    build_s, _ = cpu_seconds(lambda: paths["per-record"].update_batch(deltas[:1], contexts(1)))
    rows = []
    for n in args.sizes:
        times: dict[str, list[float]] = {"per-record": [], "batched": []}
        outs = {}
        for r in range(args.repeats):  # alternate, starting with each in turn
            order = ["per-record", "batched"] if r % 2 == 0 else ["batched", "per-record"]
            for label in order:
                seconds, outs[label] = cpu_seconds(
                    lambda label=label, n=n: paths[label].update_batch(deltas[:n], contexts(n))
                )
                times[label].append(seconds / n)
        one = torch.stack([layout.flatten(u) for u in outs["per-record"]])
        batch = torch.stack([layout.flatten(u) for u in outs["batched"]])
        differ = one != batch
        ratios = [a / b for a, b in zip(times["per-record"], times["batched"], strict=True)]
        rows.append(
            {
                "n": n,
                "per_record_ms": 1e3 * statistics.median(times["per-record"]),
                "batched_ms": 1e3 * statistics.median(times["batched"]),
                "speedup": statistics.median(times["per-record"]) / statistics.median(times["batched"]),
                "speedup_range": [min(ratios), max(ratios)],
                "rows_differing": int(differ.any(dim=1).sum()),
                "coordinates_differing": int(differ.sum()),
                "max_abs_difference_over_eps": float((one - batch).abs().max()) / BOARD_RECUP["eps"],
                "per_record_s_all": times["per-record"],
                "batched_s_all": times["batched"],
            }
        )
    zoo = zoo_training(features, race, n_classes, args.zoo_repeats)
    load = os.getloadavg()
    print(
        f"RecUP-FL FGSM per update, CPU ms (process time, median of {args.repeats}, alternating), "
        f"--threads {args.threads}, attribute board's case (P=10, Q=5, zoo 5); "
        f"zoo build {build_s:.1f} CPU s; "
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}:\n"
    )
    table = [
        [
            r["n"],
            r["per_record_ms"],
            r["batched_ms"],
            f"{r['speedup']:.2f}x [{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}]",
            f"{r['rows_differing']} of {r['n']} ({r['coordinates_differing']} coordinates)",
        ]
        for r in rows
    ]
    header = ["N", "per-record ms/update", "batched ms/update", "speed-up [range]", "outputs differing"]
    print(markdown_table(header, table))
    print(
        f"\nZoo training (5 members, 30 epochs, batch 64, {len(race)} records, median of "
        f"{args.zoo_repeats}): torch.optim.SGD loop {zoo['sgd_loop_cpu_s']:.1f} CPU s, train_classifier "
        f"{zoo['train_classifier_cpu_s']:.1f} CPU s ({zoo['speedup']:.2f}x), weights identical: "
        f"{zoo['identical']}"
    )
    checks = [
        check(f"recup-fl batched FGSM vs per-record, N = {r['n']}", r["speedup"], ">= 5x", r["speedup"] >= 5)
        for r in rows
        if r["n"] >= 400
    ]
    env = environment("cpu", args.quick, args.threads) | {"loadavg": list(load), "zoo_build_cpu_s": build_s}
    write_json(args.out, {"rows": rows, "zoo_training": zoo, "checks": checks, "env": env})


if __name__ == "__main__":
    main()
