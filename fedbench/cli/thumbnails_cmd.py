"""`fedbench leaderboard thumbnails BOARD`: a board's reconstructions.png, drawn from its runs
(`fedbench.reporting.thumbnails`); read from the run cache, or computed where it lacks them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import CacheDirOption, DataRootOption, PluginOption, err, literal
from fedbench.cli.running import PresetDirOption


def thumbnails_cmd(
    board: Annotated[str, typer.Argument(help="Board name (an inversion board).")],
    cache_dir: CacheDirOption = None,
    victims: Annotated[
        int, typer.Option("--victims", min=1, max=16, help="Victims (private images) shown per defense.")
    ] = 4,
    seed: Annotated[int, typer.Option("--seed", help="The seed whose victims are shown.")] = 0,
    cached_only: Annotated[
        bool,
        typer.Option(
            "--cached-only",
            help="Read the runs from the cache only; exit 2 naming how many are missing instead of "
            "computing them (nothing is written to the cache).",
        ),
    ] = False,
    root: Annotated[Path, typer.Option("--dir", help="Folder holding the boards.")] = Path("leaderboards"),
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help=literal("PNG to write [default: <dir>/<board>/reconstructions.png].")),
    ] = None,
    data_root: DataRootOption = None,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Draw a board's reconstruction thumbnails: one small PNG (at most 150 KB), the private images of
    a few victims on top and, per defense (in rank order), each victim's worst-case reconstruction:
    the attack of the suite that leaks most by the board's headline metric, as the board takes it.

    The runs are the board's own (its preset's attack runs of --seed that the entries list), read from
    the run cache. How long: about 15 s for a board whose runs the cache holds. A run the cache lacks
    is computed (its attack, not the FL training) and cached, as the board build did: the seed's share
    of the board's attack time (its README's compute note), e.g. about 15 min on 2 cores for the
    FedSGD board's 174 attack runs of seed 0, plus 5 min for LODA's obscuring; --cached-only refuses
    instead. Boards of face datasets (LFW, CelebA, and any dataset that describes itself as faces) are
    refused: their reconstructions are pictures of real people, which fedbench does not ship.

    Examples:

      fedbench leaderboard thumbnails inversion-fedsgd-mnist5k-mlp

      fedbench leaderboard thumbnails malicious-server-mnist5k-fcnn --cache-dir ~/fedbench-cache --cached-only

      fedbench leaderboard thumbnails inversion-fedavg-mnist5k-mlp --victims 2 --out /tmp/fedavg.png
    """
    from fedbench.cli._common import cache_dir_option, data_root_option, load_plugins
    from fedbench.cli.board_runs import narrowed_specs
    from fedbench.errors import FedbenchError
    from fedbench.execution.cache import RunCache
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting import ranking
    from fedbench.reporting import thumbnails as th
    from fedbench.spec.boards import resolve_boards
    from fedbench.spec.grid import build_grid
    from fedbench.spec.run import canonical_json

    load_plugins(plugin)
    lb.check_board_name(root, board)
    b, entries = lb.load_board(root / board)
    th.refuse_faces(b)
    extra = tuple(preset_dir or ())
    source = resolve_boards([b.preset or b.name], False, extra)[0]
    specs = list(build_grid(source.path, extra_dirs=extra).specs)
    specs += narrowed_specs(specs, entries)  # the runs a cascade narrowed to fewer victims
    runs = th.board_runs(b, entries, specs, seed)
    runs = {e["defense"]: runs[e["defense"]] for _, e in ranking.ranked(b, entries)}
    location = cache_dir_option(cache_dir)
    cache = RunCache(location)
    every = [spec for specs in runs.values() for spec in specs]
    missing = [spec for spec in every if not cache.has_attack(canonical_json(spec.key()))]
    if missing and cached_only:
        raise FedbenchError(
            f"{len(missing)} of the {len(every)} attack runs of seed {seed} of {board} are not in the cache "
            f"{location} (first: {missing[0].describe()}); run without --cached-only to compute them"
        )
    if cached_only:

        def load(spec):  # as stored: nothing is recomputed, replaced or written
            return cache.attack(canonical_json(spec.key()), None)[0]

    else:
        from fedbench.execution.runner import RunContext, attack_result

        ctx = RunContext(data_root=data_root_option(data_root))
        todo = {spec.run_id for spec in missing}
        done = 0

        def load(spec):
            nonlocal done
            started = time.perf_counter()
            result = attack_result(spec, cache, ctx)
            if spec.run_id in todo:
                done += 1
                took = time.perf_counter() - started
                err.print(f"[{done}/{len(todo)}] computed {spec.describe()} in {took:.1f} s", highlight=False)
            return result

    thumbs = th.worst_case(b, runs, load, victims, seed)
    path = th.save_thumbnails(thumbs, out_path or root / board / th.THUMBNAIL_FILE)
    n = len(thumbs.truth)
    read = len(every) - len(missing)
    err.print(
        f"wrote {path} ({path.stat().st_size // 1000} KB: {len(thumbs.rows)} defenses x {n} "
        f"victim{'' if n == 1 else 's'} of seed {seed}; {read} runs read from the cache, "
        f"{0 if cached_only else len(missing)} computed)",
        highlight=False,
    )
