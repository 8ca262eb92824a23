"""Shared optimisation core of the gradient-inversion attacks (DLG, iDLG, CPL, Inverting Gradients).

What it owns:

- `GradientMatcher`: the victim model made functional (`torch.func.functional_call`), the observed
  target gradient (a 'gradient' as is; a 'delta' as the equivalent gradient -delta/(lr*local_steps)),
  optional pruning masks (match only the observed non-zero entries) and per-layer weights. Its
  `objective` computes, for a stacked batch of R candidate reconstructions [R, B, C, H, W], each
  candidate's parameter gradient with `vmap(grad(loss))` (create-graph semantics come for free:
  the result is differentiable w.r.t. the candidates) and returns the R matching costs (L2 or
  1 - cosine, + TV), so one backward of their sum updates every candidate at once.
- `reconstruct_batched`: runs one optimisation over the R candidates, with either signed Adam (IG;
  elementwise, so the R candidates evolve exactly as R independent runs) or a batched L-BFGS that
  keeps per-candidate curvature history, step sizes and stopping tests (a re-implementation of
  `torch.optim.LBFGS` without line search, run per candidate; so R batched candidates equal R
  independent `torch.optim.LBFGS` runs up to floating-point rounding, unlike L-BFGS on the summed
  objective).
- Image-space helpers: normalisation constants, the valid box, conversion to [0, 1] pixels.

Device residency: nothing moves to the host inside the loops. Signed Adam makes no host sync per
iteration (its finiteness flag and success record stay on the device, read every
`FINITE_CHECK_EVERY` iterations); L-BFGS reads one boolean per evaluation for its per-candidate
stopping tests, which decide the control flow as in `torch.optim.LBFGS`.

Non-finite objectives: under L-BFGS (no line search, so a noisy or pruned target can make it
overshoot), a candidate that diverges is frozen and keeps its best finite iterate, which is what an
attacker holds (the row lists the diverged candidates in `diverged`); the best restart is chosen over
those iterates, and the run fails only when no candidate ever had a finite objective. Signed Adam
cannot diverge inside the box, so any non-finite value there fails the run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedbench.attacks._schedules import Plateau
from fedbench.errors import RunFailure

Cost = Literal["l2", "cosine"]


# ------------------------------------------------------------------------------------- image space


def channel_stats(meta: Any, channels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel (mean, std) as [1, C, 1, 1] tensors; identity when the dataset is not normalised."""
    mean = tuple(meta.mean) if meta.mean else (0.0,) * channels
    std = tuple(meta.std) if meta.std else (1.0,) * channels
    if len(mean) == 1 and channels > 1:
        mean, std = mean * channels, std * channels
    m = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return m, s


def box_bounds(meta: Any, channels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The valid normalised range [(0-mean)/std, (1-mean)/std] per channel, as [1, C, 1, 1]."""
    m, s = channel_stats(meta, channels, device)
    return (0 - m) / s, (1 - m) / s


def to_pixels(x: torch.Tensor, meta: Any) -> torch.Tensor:
    """Normalised images [..., C, H, W] -> [0, 1] pixels (clamped)."""
    m, s = channel_stats(meta, x.shape[-3], x.device)
    return (x * s + m).clamp(0, 1)


def from_pixels(u: torch.Tensor, meta: Any) -> torch.Tensor:
    """[0, 1] pixels -> normalised model-input space."""
    m, s = channel_stats(meta, u.shape[-3], u.device)
    return (u - m) / s


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """inversefed's anisotropic mean TV, per candidate: x [R, B, C, H, W] -> [R]."""
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    return dx + dy


# ------------------------------------------------------------------------------------ the matcher


def prepare_model(
    model: nn.Module, global_state: dict[str, torch.Tensor], mode: str, device: torch.device
) -> nn.Module:
    """Load the victim's state, put the model in the victim's mode, freeze its parameters."""
    model.load_state_dict({k: v.to(device) for k, v in global_state.items()}, strict=True)
    model.to(device)
    model.train(mode == "train")
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def target_gradient(
    kind: str, shared: dict[str, torch.Tensor], lr: float, local_steps: int
) -> tuple[dict[str, torch.Tensor], str]:
    """The gradient to match and a note on the approximation made.

    'gradient' is matched as is. 'delta' (w_end - w_start after `local_steps` SGD steps of size `lr`)
    is matched as the single equivalent gradient -delta / (lr * local_steps): exact for one local
    step, the usual FedAvg approximation otherwise (the local trajectory is not simulated).
    """
    if kind == "gradient":
        return {k: v.detach().float() for k, v in shared.items()}, "gradient matched as is"
    if kind == "delta":
        scale = -1.0 / (lr * max(local_steps, 1))
        note = (
            f"delta matched as the equivalent gradient -delta/(lr*local_steps) "
            f"(lr={lr:g}, local_steps={local_steps}); exact only for one local step"
        )
        return {k: v.detach().float() * scale for k, v in shared.items()}, note
    raise RunFailure(f"cannot match an observation of kind '{kind}' (need 'gradient' or 'delta')")


def layer_weights(n: int, scheme: str) -> list[float]:
    """inversefed's per-layer weights: 'equal', 'linear' (decreasing to the output), 'exp' (softmax)."""
    if scheme == "equal" or n == 0:
        return [1.0] * n
    lin = torch.arange(n, 0, -1, dtype=torch.float64) / n
    w = lin if scheme == "linear" else lin.softmax(0)
    w = w / w[0]
    return [float(v) for v in w]


def resolve_pruning(mode: str | bool, sparsified: bool, targets: list[torch.Tensor]) -> tuple[bool, float]:
    """Whether to match only the observed non-zero entries, and the observed zero fraction.

    `auto` is on exactly when a defense that zeroes entries acted on the observation
    (`Observation.sparsified`, declared by the defense): the pruning-adaptive objective of spec 001
    §2.2. Exact zeros alone do not switch it on: an undefended ReLU network's gradient has many (a
    third of a ConvNet's entries), and masking them would change DLG's and IG's objective from the
    papers' on undefended models.
    """
    total = sum(t.numel() for t in targets)
    zeros = sum(int((t == 0).sum()) for t in targets)
    frac = zeros / max(total, 1)
    if isinstance(mode, bool):
        return mode, frac
    if mode == "on":
        return True, frac
    if mode == "off":
        return False, frac
    return bool(sparsified), frac


def update_as_gradient(kind: str, local_steps: int) -> str | None:
    """The row's note on how an update was matched, or None when a gradient was observed as is.

    A FedAvg weight delta is matched as one equivalent gradient -delta/(lr*local_steps): exact for one
    local step, an approximation for more (the local trajectory is not simulated).
    """
    if kind != "delta":
        return None
    steps = max(int(local_steps), 1)
    exactness = "exact" if steps == 1 else "approximate"
    return f"-delta/(lr*{steps}): {exactness}, {steps} local step{'s' if steps > 1 else ''}"


class GradientMatcher:
    """Matching cost between candidates' gradients and an observed gradient, batched over candidates."""

    def __init__(
        self,
        model: nn.Module,
        target: dict[str, torch.Tensor],
        *,
        cost: Cost = "l2",
        pruning_aware: bool = False,
        weights: str = "equal",
        tv_weight: float = 0.0,
    ):
        self.model = model
        if model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            # train-mode BN: batch statistics without touching running stats (vmap-safe)
            self.model = copy.deepcopy(model)
            torch.func.replace_all_batch_norm_modules_(self.model)
        named = dict(self.model.named_parameters())
        missing = [k for k in target if k not in named]
        if missing:
            raise RunFailure(f"observed tensors {missing[:3]} are not parameters of the model")
        self.names = [k for k in named if k in target]
        if not self.names:
            raise RunFailure("the observation shares no parameter of the model")
        device = next(iter(named.values())).device
        self.fixed = {k: v.detach() for k, v in named.items() if k not in target}
        self.params = {k: named[k].detach() for k in self.names}
        self.buffers = {k: v for k, v in self.model.named_buffers()}
        self.targets = [target[k].to(device) for k in self.names]
        self.cost = cost
        self.pruning_aware = pruning_aware
        self.masks = [(t != 0).to(t.dtype) for t in self.targets] if pruning_aware else None
        self.weights = layer_weights(len(self.names), weights)
        self.tv_weight = float(tv_weight)
        if cost == "cosine":
            tn = sum(w * ((t * t).sum()) for w, t in zip(self.weights, self.targets, strict=True))
            self.target_norm = tn.sqrt()
        model_ref = self.model

        def loss_fn(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(model_ref, ({**self.fixed, **p}, self.buffers), (x,))
            return F.cross_entropy(out, y)  # mean over the batch; y int [B] or probabilities [B, K]

        self._vgrad = torch.func.vmap(torch.func.grad(loss_fn), in_dims=(None, 0, 0), randomness="different")
        self._single: tuple[nn.Module, list[torch.Tensor]] | None = None  # made on the first single call

    def _single_model(self) -> tuple[nn.Module, list[torch.Tensor]]:
        """A private copy of the model whose matched parameters are autograd leaves (one candidate)."""
        if self._single is None:
            model = copy.deepcopy(self.model)
            named = dict(model.named_parameters())
            self._single = (model, [named[k].requires_grad_(True) for k in self.names])
        return self._single

    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """Per-candidate parameter gradients: x [R, B, ...], y [R, B] or [R, B, K] -> list of [R, ...].

        One candidate goes through plain autograd with create_graph on a copy of the model (what
        breaching does): the same values as torch.func.grad over functional_call, without functorch's
        and functional_call's per-operation dispatch (~25 % of an evaluation on LeNet-size models);
        several go through vmap(grad)."""
        if x.shape[0] == 1:
            model, leaves = self._single_model()
            with torch.enable_grad():
                loss = F.cross_entropy(model(x[0]), y[0])
                g = torch.autograd.grad(
                    loss,
                    leaves,
                    create_graph=x.requires_grad or y.requires_grad,
                    materialize_grads=True,
                )
            return [gi.unsqueeze(0) for gi in g]
        g = self._vgrad(self.params, x, y)
        return [g[k] for k in self.names]

    def match(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Matching cost per candidate [R] (without TV)."""
        masks = self.masks or [None] * len(grads)
        if self.cost == "l2":
            out = 0
            for w, g, t, m in zip(self.weights, grads, self.targets, masks, strict=True):
                d = g - t
                if m is not None:
                    d = d * m
                out = out + w * d.pow(2).flatten(1).sum(1)
            return out
        dot, gn = 0, 0
        for w, g, t, m in zip(self.weights, grads, self.targets, masks, strict=True):
            if m is not None:
                g = g * m
            dot = dot + w * (g * t).flatten(1).sum(1)
            gn = gn + w * g.pow(2).flatten(1).sum(1)
        return 1 - dot / (gn.sqrt() * self.target_norm)

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Full objective per candidate [R]: matching cost + tv_weight * TV(x)."""
        out = self.match(self.gradients(x, y))
        if self.tv_weight:
            out = out + self.tv_weight * total_variation(x)
        return out


# --------------------------------------------------------------------------------- optimisation


@dataclass
class Reconstruction:
    """Result of `reconstruct_batched` (all tensors detached, candidates on dim 0)."""

    x: torch.Tensor  # [R, B, C, H, W] normalised
    label_logits: torch.Tensor | None  # [R, B, K] when labels were optimised
    objective: torch.Tensor  # [R] each candidate's best finite objective (inf when it never had one)
    iterations: int
    evaluations: int
    iterations_to_success: list[int | None] = field(default_factory=list)
    diverged: list[bool] = field(default_factory=list)
    stopped: str = "budget"  # plateau schedule: 'converged' or 'budget' (the cap)
    lr_decays: list[list[int]] = field(default_factory=list)  # per candidate: iterations of each decay

    @property
    def best(self) -> int:
        return int(torch.argmin(self.objective).item())


def _fail(name: str, i: int) -> RunFailure:
    return RunFailure(f"{name}: non-finite objective at iteration {i}")


def reconstruct_batched(
    matcher: GradientMatcher,
    x0: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    label_logits0: torch.Tensor | None = None,
    optimizer: str = "adam-signed",
    iterations: int = 500,
    lr: float = 0.1,
    box: tuple[torch.Tensor, torch.Tensor] | None = None,
    lr_decay: bool = True,
    lbfgs_max_iter: int = 20,
    lbfgs_history: int = 100,
    success_threshold: float | None = None,
    stop_on_success: bool = False,
    plateau: Plateau | None = None,
    name: str = "attack",
) -> Reconstruction:
    """Optimise R candidates [R, B, C, H, W] at once against `matcher`.

    `labels` (int64 [B], shared by all candidates) fixes the labels; otherwise `label_logits0`
    [R, B, K] are optimised jointly (DLG; soft labels softmax(logits)). `optimizer` is 'adam-signed'
    (IG: Adam on the sign of the image gradient, MultiStepLR x0.1 at 3/8, 5/8, 7/8 when `lr_decay`,
    clamp into `box` after every step) or 'lbfgs' (per-candidate L-BFGS, one iteration = one
    `torch.optim.LBFGS.step` with `max_iter` inner evaluations; the box is applied to the output only).
    `success_threshold`: the first iteration after which a candidate's objective is below it is
    recorded in `iterations_to_success`. `plateau` (signed Adam only) replaces the fixed milestones
    by decays when a candidate's objective stops improving, and stops it once it has converged.
    """
    if (labels is None) == (label_logits0 is None):
        raise ValueError("give exactly one of labels / label_logits0")
    R = x0.shape[0]
    if optimizer == "adam-signed":
        if label_logits0 is not None:
            raise ValueError("adam-signed optimises images only; give labels")
        if plateau is not None:
            return _adam_signed_plateau(
                matcher,
                x0,
                labels,
                plateau,
                iterations=iterations,
                lr=lr,
                box=box,
                lr_decay=lr_decay,
                name=name,
            )
        return _adam_signed(
            matcher, x0, labels, iterations, lr, box, lr_decay, success_threshold, stop_on_success, name
        )
    if optimizer != "lbfgs":
        raise ValueError(f"unknown optimizer {optimizer!r}")
    shape_x = x0.shape
    nx = x0[0].numel()
    parts = [x0.reshape(R, -1)]
    if label_logits0 is not None:
        shape_l = label_logits0.shape
        parts.append(label_logits0.reshape(R, -1))
    z = torch.cat(parts, 1).detach().clone()
    y_fixed = labels.unsqueeze(0).expand(R, -1) if labels is not None else None

    def split(zz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = zz[:, :nx].reshape(shape_x)
        if y_fixed is not None:
            return x, y_fixed
        return x, zz[:, nx:].reshape(shape_l).softmax(-1)

    def closure(zz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zz = zz.detach().requires_grad_(True)
        with torch.enable_grad():
            x, y = split(zz)
            obj = matcher.objective(x, y)
            (g,) = torch.autograd.grad(obj.sum(), zz)
        return obj.detach(), g.detach()

    res = _lbfgs(
        closure, z, iterations, lr, lbfgs_max_iter, lbfgs_history, success_threshold, stop_on_success, name
    )
    zf, obj, its, evals, success, dead = res
    x = zf[:, :nx].reshape(shape_x)
    logits = zf[:, nx:].reshape(shape_l) if label_logits0 is not None else None
    if box is not None:
        x = torch.maximum(torch.minimum(x, box[1]), box[0])
    return Reconstruction(x, logits, obj, its, evals, success, dead)


#: On a CPU, restarts run as one vmap batch only up to this many forward FLOPs per candidate: batching
#: pays where per-operation overhead dominates (LeNet, 1.2 MFLOP: 4.4x the reconstructions/s; ConvNet-8,
#: 45 MFLOP: 1.7x) and not where one candidate's kernels already fill the cores (ConvNet-64, 2.9 GFLOP:
#: 1.0x at 8-10x the memory; `benchmarks/bench_inversion.py`). On a GPU restarts are always batched.
BATCH_RESTARTS_MAX_FLOPS = 1e8


def restarts_pay_as_one_batch(matcher: GradientMatcher, x: torch.Tensor) -> bool:
    """Whether R restarts should share one vmap batch, from the forward FLOPs of one candidate `x`."""
    if x.device.type != "cpu":
        return True
    from torch.utils.flop_counter import FlopCounterMode

    # the matcher's model: train-mode BN there keeps no running statistics, so this forward changes
    # nothing; fork_rng keeps a dropout draw from moving the global random stream
    with torch.random.fork_rng(), torch.no_grad(), FlopCounterMode(display=False) as counter:
        matcher.model(x)
    return counter.get_total_flops() <= BATCH_RESTARTS_MAX_FLOPS


def reconstruct_restarts(
    matcher: GradientMatcher,
    x0: torch.Tensor,
    *,
    batched: bool,
    label_logits0: torch.Tensor | None = None,
    **kw: Any,
) -> Reconstruction:
    """`reconstruct_batched` over R restarts: as one batch, or one restart at a time (`batched=False`,
    the same per-candidate algorithm; only the stop-on-success rule then stops each restart on its own)."""
    if batched:
        return reconstruct_batched(matcher, x0, label_logits0=label_logits0, **kw)
    parts = [
        reconstruct_batched(
            matcher,
            x0[r : r + 1],
            label_logits0=None if label_logits0 is None else label_logits0[r : r + 1],
            **kw,
        )
        for r in range(x0.shape[0])
    ]
    logits = None if parts[0].label_logits is None else torch.cat([p.label_logits for p in parts])
    return Reconstruction(
        torch.cat([p.x for p in parts]),
        logits,
        torch.cat([p.objective for p in parts]),
        max(p.iterations for p in parts),
        max(p.evaluations for p in parts),
        [s for p in parts for s in p.iterations_to_success],
        [d for p in parts for d in p.diverged],
        stopped="converged" if all(p.stopped == "converged" for p in parts) else "budget",
        lr_decays=[d for p in parts for d in p.lr_decays],
    )


def _adam_signed(
    matcher: GradientMatcher,
    x0: torch.Tensor,
    labels: torch.Tensor,
    iterations: int,
    lr: float,
    box: tuple[torch.Tensor, torch.Tensor] | None,
    lr_decay: bool,
    success_threshold: float | None,
    stop_on_success: bool,
    name: str,
) -> Reconstruction:
    R = x0.shape[0]
    x = x0.detach().clone().requires_grad_(True)
    y = labels.unsqueeze(0).expand(R, -1)
    opt = torch.optim.Adam([x], lr=lr)
    sched = None
    if lr_decay:
        milestones = [int(iterations / 2.667), int(iterations / 1.6), int(iterations / 1.142)]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    success = _no_success(R, x.device)
    bad_at = torch.full((), -1, dtype=torch.long, device=x.device)  # first non-finite iteration
    it = 0
    for it in range(iterations):
        opt.zero_grad(set_to_none=True)
        obj = matcher.objective(x, y)
        # no host sync per iteration (on a GPU, one would stall the queue): the finiteness test and
        # the success record stay on the device and are read every FINITE_CHECK_EVERY iterations
        bad_at = torch.where((bad_at < 0) & ~torch.isfinite(obj).all(), it, bad_at)
        if it % FINITE_CHECK_EVERY == 0 and int(bad_at) >= 0:  # from the first iteration on
            raise _fail(name, int(bad_at))
        success = _record_success(success, obj, success_threshold, it)
        if stop_on_success and bool((success >= 0).all()):  # the stopping rule reads it every iteration
            break
        (g,) = torch.autograd.grad(obj.sum(), x)
        x.grad = g.sign()
        opt.step()
        if sched is not None:
            sched.step()
        _clamp_into(box, [x])
    else:
        it = iterations
    final = _final_objective(matcher, x.detach(), y, bad_at, it, name)
    success = _record_success(success, final, success_threshold, it)
    return Reconstruction(x.detach(), None, final, it, it + 1, _success_list(success), [False] * R)


#: The signed-Adam loop reads its on-device finiteness flag every this many iterations (from the first).
FINITE_CHECK_EVERY = 25


def _adam_signed_plateau(
    matcher: GradientMatcher,
    x0: torch.Tensor,
    labels: torch.Tensor,
    plateau: Plateau,
    *,
    iterations: int,
    lr: float,
    box: tuple[torch.Tensor, torch.Tensor] | None,
    lr_decay: bool,
    name: str,
) -> Reconstruction:
    """Signed Adam under a `Plateau` schedule: one parameter group per candidate, so each candidate has
    its own step size and stops on its own (a stopped candidate's step size is 0: its iterate stays)."""
    R = x0.shape[0]
    xs = [x0[r].detach().clone().requires_grad_(True) for r in range(R)]
    opt = torch.optim.Adam([{"params": [x], "lr": lr} for x in xs], lr=lr)
    y = labels.unsqueeze(0).expand(R, -1)
    device = x0.device
    best = torch.full((R,), math.inf, device=device)
    improved_at = torch.zeros(R, dtype=torch.long, device=device)
    bad_at = torch.full((), -1, dtype=torch.long, device=device)
    decays_left = [plateau.decays if lr_decay else 0] * R
    decayed_at: list[list[int]] = [[] for _ in range(R)]
    running = [True] * R
    it = 0
    for it in range(iterations):
        x = torch.stack(xs)
        obj = matcher.objective(x, y)
        bad_at = torch.where((bad_at < 0) & ~torch.isfinite(obj).all(), it, bad_at)
        # improved: below best by rtol of |best|; a cosine cost can dip just below 0 by rounding, where
        # best * (1 - rtol) would lie above best and a repeated value would count as an improvement
        better = obj.detach() < torch.where(best > 0, best * (1 - plateau.rtol), best * (1 + plateau.rtol))
        improved_at = torch.where(better, it, improved_at)
        best = torch.where(better, obj.detach(), best)
        if it % plateau.check_every == 0 and it:
            if int(bad_at) >= 0:
                raise _fail(name, int(bad_at))
            since = (it - improved_at).tolist()
            for r in range(R):
                if not (running[r] and since[r] >= plateau.patience_after(len(decayed_at[r]))):
                    continue
                if decays_left[r]:
                    decays_left[r] -= 1
                    decayed_at[r].append(it)
                    opt.param_groups[r]["lr"] *= plateau.factor
                    improved_at[r] = it
                else:
                    running[r] = False
                    opt.param_groups[r]["lr"] = 0.0
            if not any(running):
                break
        grads = torch.autograd.grad(obj.sum(), xs)
        for x_r, g in zip(xs, grads, strict=True):
            x_r.grad = g.sign()
        opt.step()
        _clamp_into(box, xs)
    else:
        it = iterations
    x = torch.stack([x_r.detach() for x_r in xs])
    final = _final_objective(matcher, x, y, bad_at, it, name)
    stopped = "converged" if not any(running) else "budget"
    return Reconstruction(
        x, None, final, it, it + 1, [None] * R, [False] * R, stopped=stopped, lr_decays=decayed_at
    )


def _clamp_into(box: tuple[torch.Tensor, torch.Tensor] | None, xs: list[torch.Tensor]) -> None:
    """Signed Adam's projection: each iterate into the valid box, in place (no box: unconstrained)."""
    if box is not None:
        with torch.no_grad():
            for x in xs:
                x.data = torch.maximum(torch.minimum(x.data, box[1]), box[0])


def _final_objective(
    matcher: GradientMatcher, x: torch.Tensor, y: torch.Tensor, bad_at: torch.Tensor, it: int, name: str
) -> torch.Tensor:
    """The objective of signed Adam's final iterate; the run fails on any non-finite value seen."""
    if int(bad_at) >= 0:
        raise _fail(name, int(bad_at))
    with torch.no_grad():
        final = matcher.objective(x, y)
    if not bool(torch.isfinite(final).all()) or not bool(torch.isfinite(x).all()):
        raise _fail(name, it)
    return final.detach()


def _no_success(R: int, device: torch.device) -> torch.Tensor:
    """Per-candidate first successful iteration, on the device; -1: not yet."""
    return torch.full((R,), -1, dtype=torch.long, device=device)


def _record_success(
    success: torch.Tensor, obj: torch.Tensor, threshold: float | None, it: int
) -> torch.Tensor:
    """Mark candidates whose objective after `it` completed iterations is below the threshold."""
    if threshold is None:
        return success
    return torch.where((success < 0) & (obj < threshold), it, success)


def _success_list(success: torch.Tensor) -> list[int | None]:
    return [None if s < 0 else int(s) for s in success.tolist()]


def _lbfgs(
    closure: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    z: torch.Tensor,
    iterations: int,
    lr: float,
    max_iter: int,
    history: int,
    success_threshold: float | None,
    stop_on_success: bool,
    name: str,
):
    """Per-candidate L-BFGS on z [R, n]: `torch.optim.LBFGS` (line_search_fn=None, tolerance_grad=1e-7,
    tolerance_change=1e-9) run independently for every row, evaluated in lockstep."""
    tol_grad, tol_change = 1e-7, 1e-9
    max_eval = max_iter * 5 // 4  # torch's default max_eval
    R = z.shape[0]
    dev, dt = z.device, z.dtype
    n_iter = torch.zeros(R, dtype=torch.long, device=dev)
    d = torch.zeros_like(z)
    t = torch.zeros(R, dtype=dt, device=dev)
    prev_g = torch.zeros_like(z)
    prev_loss = torch.zeros(R, dtype=dt, device=dev)
    h_diag = torch.ones(R, dtype=dt, device=dev)
    # history slots: (s [R,n], y [R,n], rho [R], valid [R] bool); per-candidate FIFO of `history` entries
    slots: list[list[torch.Tensor]] = []
    dead = torch.zeros(R, dtype=torch.bool, device=dev)
    success = _no_success(R, dev)
    evals = 0
    loss = torch.zeros(R, dtype=dt, device=dev)
    done_iters = 0

    # L-BFGS without a line search (the DLG code's setting) can overshoot once a noisy target cannot be
    # matched exactly; like breaching, return each candidate's best iterate, not its last one.
    best_loss = torch.full((R,), math.inf, dtype=dt, device=dev)
    best_z = z.clone()

    def keep_best(obj: torch.Tensor, zz: torch.Tensor) -> None:
        nonlocal best_loss, best_z
        better = ~dead & torch.isfinite(obj) & (obj < best_loss)
        if bool(better.any()):
            best_loss = torch.where(better, obj.detach(), best_loss)
            best_z = torch.where(better[:, None], zz.detach(), best_z)

    def check(obj: torch.Tensor, gz: torch.Tensor, zz: torch.Tensor, snapshot: torch.Tensor, i: int) -> None:
        nonlocal dead
        bad = ~(torch.isfinite(obj) & torch.isfinite(gz).all(1) & torch.isfinite(zz).all(1)) & ~dead
        if bool(bad.any()):
            zz[bad] = snapshot[bad]
            dead = dead | bad

    for i in range(iterations):
        snapshot = z.clone()
        loss, g = closure(z)
        evals += 1
        check(loss, g, z, snapshot, i)
        keep_best(loss, z)
        if bool(dead.all()):  # every candidate diverged: each keeps its best finite iterate
            break
        alive = ~dead
        alive_loss = torch.where(alive, loss, torch.full_like(loss, math.inf))
        success = _record_success(success, alive_loss, success_threshold, i)
        if stop_on_success and bool(((success >= 0) | dead).all()):
            break
        active = alive & (g.abs().amax(1) > tol_grad)
        step_evals = 1
        for inner in range(1, max_iter + 1):
            if not bool(active.any()):
                break
            n_iter = n_iter + active.long()
            first = n_iter == 1
            direction = -g
            later = active & ~first
            if bool(later.any()):
                y = g - prev_g
                s = d * t[:, None]
                ys = (y * s).sum(1)
                upd = later & (ys > 1e-10)
                if bool(upd.any()):
                    # per-candidate FIFO eviction of the oldest valid slot
                    counts = torch.zeros(R, dtype=torch.long, device=dev)
                    for sl in slots:
                        counts += sl[3].long()
                    full = upd & (counts >= history)
                    if bool(full.any()):
                        for sl in slots:
                            ev = full & sl[3]
                            sl[3] = sl[3] & ~ev
                            full = full & ~ev
                            if not bool(full.any()):
                                break
                    rho = torch.where(upd, 1.0 / ys, torch.zeros_like(ys))
                    slots.append([s.clone(), y.clone(), rho, upd])
                    slots = [sl for sl in slots if bool(sl[3].any())]
                    h_diag = torch.where(upd, ys / (y * y).sum(1), h_diag)
                # two-loop recursion
                q = -g
                alphas = []
                for s_k, y_k, rho_k, v_k in reversed(slots):
                    a = torch.where(v_k, (s_k * q).sum(1) * rho_k, torch.zeros_like(rho_k))
                    q = q - a[:, None] * y_k
                    alphas.append(a)
                r_ = q * h_diag[:, None]
                for (s_k, y_k, rho_k, v_k), a in zip(slots, reversed(alphas), strict=True):
                    b = torch.where(v_k, (y_k * r_).sum(1) * rho_k, torch.zeros_like(rho_k))
                    r_ = r_ + s_k * (a - b)[:, None]
                direction = torch.where(first[:, None], -g, r_)
            d = torch.where(active[:, None], direction, d)
            prev_g = torch.where(active[:, None], g, prev_g)
            prev_loss = torch.where(active, loss, prev_loss)
            t_first = torch.clamp(1.0 / g.abs().sum(1), max=1.0) * lr
            t = torch.where(active, torch.where(first, t_first, torch.full_like(t, lr)), t)
            gtd = (g * d).sum(1)
            active = active & ~(gtd > -tol_change)
            z = z + (t * active)[:, None] * d
            if inner != max_iter:
                new_loss, new_g = closure(z)
                evals += 1
                step_evals += 1
                check(new_loss, new_g, z, snapshot, i)
                keep_best(new_loss, z)
                active = active & ~dead
                loss = torch.where(active, new_loss, loss)
                g = torch.where(active[:, None], new_g, g)
                opt_cond = g.abs().amax(1) <= tol_grad
            else:
                break
            if step_evals >= max_eval:
                break
            active = active & ~opt_cond
            active = active & ~((d * t[:, None]).abs().amax(1) <= tol_change)
            active = active & ~((loss - prev_loss).abs() < tol_change)
        done_iters = i + 1
    final, g = closure(z)
    evals += 1
    snapshot = z.clone()
    check(final, g, z, snapshot, done_iters)
    keep_best(final, z)
    if not bool(torch.isfinite(best_loss).any()):
        raise _fail(name, done_iters)
    z, final = best_z, best_loss
    success = _record_success(
        success, torch.where(dead, torch.full_like(final, math.inf), final), success_threshold, done_iters
    )
    return z, final, done_iters, evals, _success_list(success), dead.tolist()


# ----------------------------------------------------------------------------- attack plumbing


def initial_images(
    init: str,
    R: int,
    B: int,
    shape: tuple[int, ...],
    meta: Any,
    generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """Initial candidates [R, B, C, H, W] in normalised space, drawn on the CPU from `generator`.

    'randn': N(0, 1) in normalised space (DLG, inversefed). 'uniform': U[0, 1) pixels.
    'patterned': CPL's patterned random seed, a U[0, 1) pixel tile of (C, ceil(H/2), ceil(W/2))
    repeated 2x2 and cropped to (H, W).
    """
    c, h, w = shape
    if init == "randn":
        return torch.randn((R, B, c, h, w), generator=generator).to(device)
    if init == "uniform":
        u = torch.rand((R, B, c, h, w), generator=generator)
    elif init == "patterned":
        tile = torch.rand((R, B, c, (h + 1) // 2, (w + 1) // 2), generator=generator)
        u = tile.repeat(1, 1, 1, 2, 2)[..., :h, :w]
    else:
        raise ValueError(f"unknown init {init!r}")
    return from_pixels(u.to(device), meta)


def run_inversion(
    self: Any, observation: Any, model: nn.Module, meta: Any, generator: Any, device: Any
) -> Any:
    """The common `run` of the gradient-inversion attacks (see `inversion_base.InversionAttack`)."""
    from fedbench.attacks.label_recovery import recover_labels
    from fedbench.plugin import AttackOutput

    reason = self.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    p = self.params
    cfg = self.settings(meta)
    model = prepare_model(model, observation.global_state, observation.model_mode, device)
    target, note = target_gradient(
        observation.kind, observation.shared, observation.lr, observation.local_steps
    )
    batch = int(len(observation.y_true))  # the batch size is known; the labels are not
    shape = tuple(int(s) for s in meta.input_shape)
    guess = recover_labels(
        p.labels,
        model=model,
        grads=target,
        num_classes=meta.num_classes,
        batch=batch,
        y_true=observation.y_true if p.labels == "known" else None,
        input_shape=shape,
        generator=generator,
        device=device,
    )
    sparsified = bool(getattr(observation, "sparsified", False))
    prune, zero_frac = resolve_pruning(p.pruning_aware, sparsified, list(target.values()))
    matcher = GradientMatcher(
        model,
        target,
        cost=cfg["cost"],
        pruning_aware=prune,
        weights=cfg.get("weights", "equal"),
        tv_weight=cfg.get("tv_weight", 0.0),
    )
    R = int(p.restarts)
    x0 = initial_images(cfg["init"], R, batch, shape, meta, generator, device)
    logits0 = None
    if guess.labels is None:
        logits0 = torch.randn((R, batch, meta.num_classes), generator=generator).to(device)
    box = box_bounds(meta, shape[0], device) if cfg.get("boxed", True) else None
    batched = R == 1 or restarts_pay_as_one_batch(matcher, x0[0])
    rec = reconstruct_restarts(
        matcher,
        x0,
        batched=batched,
        labels=guess.labels,
        label_logits0=logits0,
        optimizer=cfg["optimizer"],
        iterations=cfg["iterations"],
        lr=cfg["lr"],
        box=box,
        lr_decay=cfg.get("lr_decay", True),
        lbfgs_max_iter=cfg.get("lbfgs_max_iter", 20),
        lbfgs_history=cfg.get("lbfgs_history", 100),
        success_threshold=cfg.get("success_threshold"),
        stop_on_success=cfg.get("stop_on_success", False),
        plateau=cfg.get("plateau"),
        name=self.name,
    )
    best = rec.best
    x_best = rec.x[best]
    images = to_pixels(x_best, meta)
    if not bool(torch.isfinite(images).all()):
        raise _fail(self.name, rec.iterations)
    if guess.labels is not None:
        labels = guess.labels
    else:
        labels = rec.label_logits[best].argmax(-1)
    objectives = [float(v) if math.isfinite(float(v)) else None for v in rec.objective.tolist()]
    extra: dict[str, Any] = {
        "iterations": int(rec.iterations),
        "evaluations": int(rec.evaluations),
        "final_objective": objectives[best],
        "restart_objectives": objectives,
        "restarts": R,
        "restarts_batched": batched,
        "best_restart": best,
        "diverged_restarts": int(sum(rec.diverged)),
        "cost": cfg["cost"],
        "optimizer": cfg["optimizer"],
        "init": cfg["init"],
        "tv_weight": float(cfg.get("tv_weight", 0.0)),
        "label_strategy": guess.strategy,
        "labels_known": p.labels == "known",
        "bn_stats_known": False,
        "model_mode": observation.model_mode,
        "observation_kind": observation.kind,
        "observation_note": note,
        "pruning_aware": bool(prune),
        "observation_sparsified": sparsified,
        "observed_zero_fraction": round(float(zero_frac), 6),
        "matched_tensors": len(matcher.names),
    }
    if cfg.get("plateau") is not None:  # the schedule decided the budget: say where it decayed and stopped
        extra["schedule"] = cfg.get("schedule", "plateau")
        extra["stopped"] = rec.stopped  # 'converged' or 'budget' (the schedule's cap)
        extra["lr_decays"] = rec.lr_decays[best]
    as_gradient = update_as_gradient(observation.kind, observation.local_steps)
    if as_gradient is not None:
        extra["update_as_gradient"] = as_gradient
    if cfg.get("success_threshold") is not None:
        its = rec.iterations_to_success[best]
        extra["success_threshold"] = float(cfg["success_threshold"])
        extra["success"] = its is not None
        extra["iterations_to_success"] = its
    return AttackOutput(
        images=images.detach().cpu().numpy().astype("float32"),
        labels=labels.detach().cpu().numpy().astype("int64"),
        extra=extra,
    )
