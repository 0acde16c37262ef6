"""PTR transition scorer for MetaWorld data, with the pool / target / calibration choices
that make its weights rank sources the right way.

Sample i = (context c_i = current observation, action a_i = the Ta logged actions that
run before the consequence, target y_i = obs[t+Ta] - obs[t] on hand xyz, gripper and
object xyz, standardised). The scorer embeds (c, a) and y and scores a candidate by a
scaled dot product; it is trained with InfoNCE (cross-entropy of the true target's index
among K candidates).

Why not the textbook pool (see issue 7's pilot):
  * random in-batch negatives: the context alone tells the targets apart, so every
    posterior saturates (r ~ K for every source) and the weights are uniform;
  * same-episode negatives: neighbouring time steps, again identified by context;
  * nearest-neighbour contexts from other episodes: hard negatives, but rare / noisy
    contexts have far neighbours, so their targets are the EASIEST to identify and the
    ranking inverts.
What is used here:
  * pool = K-1 targets of the nearest-context windows from OTHER episodes (hard negatives);
  * a second, action-ablated scorer (same pool, action input removed) measures how much of
    the identification the context alone explains;
  * the PTR score is the action-attributable ratio r = (K p_full) / (K p_ablated), i.e.
    exp(log p(y | c, a) - log p(y | c)) within the pool: high when the logged action
    explains the observed consequence beyond what the state predicts;
  * calibration: log r is averaged over a few pool draws, optionally over the episode
    (episode ids are ordinary dataset bookkeeping, not source labels), then mapped to a
    ratio whose spread the data sets (``calibrate``: quantile clip bounds, ranks, or a
    target effective sample size).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from flowrl.algorithms.ptr import auroc, effective_sample_size, info_nce_loss
from planners.robot.sources import SOURCES

Tensor = torch.Tensor


@dataclass
class ScorerConfig:
    k: int = 16                 # candidates per pool (1 true + K-1 negatives)
    neighbours: int = 48        # nearest other-episode contexts the negatives are drawn from
    pool: str = "nn"            # nn | random (in-batch, for the saturation diagnostic)
    hidden: int = 128
    emb: int = 32
    steps: int = 1500
    batch: int = 256
    lr: float = 1e-3
    ablate: bool = True         # subtract the action-ablated scorer's log-score
    smooth: str = "episode"     # episode | none: average log r over each episode
    eval_draws: int = 4         # pool draws averaged when scoring
    calibration: str = "quantile"  # quantile | rank | ess (see ``calibrate``)
    ratio: float = 4.0          # quantile / rank: calibrated r spans this factor
    q_lo: float = 0.1           # clip bounds: these quantiles of the (smoothed) log score
    q_hi: float = 0.9
    ess_target: float = 0.3     # ess: effective sample size the weights are tuned to
    seed: int = 0


def _mlp(din: int, hidden: int, dout: int) -> nn.Module:
    return nn.Sequential(nn.Linear(din, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, dout))


class TransitionScorer(nn.Module):
    """logits[b, k] = <f(c_b, a_b), g(y_bk)> * exp(log_scale); ``use_action=False`` ablates a."""

    def __init__(self, ctx_dim: int, act_dim: int, y_dim: int, hidden: int = 128, emb: int = 32, use_action: bool = True):
        super().__init__()
        self.use_action = use_action
        self.f = _mlp(ctx_dim + (act_dim if use_action else 0), hidden, emb)
        self.g = _mlp(y_dim, hidden, emb)
        self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / math.sqrt(emb))))

    def logits(self, ctx: Tensor, act: Tensor, pool: Tensor) -> Tensor:
        """ctx [B, dc], act [B, da], pool [B, K, dy] -> [B, K]."""
        h = torch.cat([ctx, act], 1) if self.use_action else ctx
        z = self.f(h)
        u = self.g(pool)
        return (z[:, None] * u).sum(-1) * self.log_scale.exp()


class PoolBuilder:
    """Candidate pools: for anchor i, K-1 targets of windows j from other episodes (same
    task) whose contexts are the nearest to c_i; the true target sits at index 0."""

    def __init__(self, ctx: Tensor, episode: Tensor, task: Tensor, neighbours: int, mode: str = "nn", chunk: int = 1024):
        self.n = ctx.shape[0]
        self.mode = mode
        self.neighbours = neighbours
        if mode == "nn":
            idx = []
            for s in range(0, self.n, chunk):
                d = torch.cdist(ctx[s:s + chunk], ctx)
                bad = (episode[s:s + chunk, None] == episode[None]) | (task[s:s + chunk, None] != task[None])
                d = d.masked_fill(bad, float("inf"))
                idx.append(d.topk(neighbours, largest=False).indices)
            self.nbrs = torch.cat(idx)
        elif mode != "random":
            raise ValueError("pool must be 'nn' or 'random'")

    def negatives(self, anchors: Tensor, k: int, g: torch.Generator) -> Tensor:
        """[B, K-1] window indices."""
        b = anchors.shape[0]
        if self.mode == "random":
            neg = torch.randint(0, self.n - 1, (b, k - 1), generator=g)
            return neg + (neg >= anchors[:, None]).long()  # never the anchor itself
        pick = torch.rand(b, self.neighbours, generator=g).argsort(1)[:, : k - 1]
        return self.nbrs[anchors][torch.arange(b)[:, None], pick]


class PTRScorer:
    """Train the full and action-ablated scorers on a RobotDataset and score every window."""

    def __init__(self, config: Optional[ScorerConfig] = None):
        self.config = config or ScorerConfig()

    def features(self, ds) -> Dict[str, Tensor]:
        """Scorer inputs, standardised with the statistics of the data the scorer was fit on."""
        ctx, y = ds.obs[:, -1], ds.consequences
        if not hasattr(self, "norm"):
            self.norm = (ctx.mean(0), ctx.std(0).clamp(min=1e-3), y.mean(0), y.std(0).clamp(min=1e-4))
        cm, cs, ym, ys = self.norm
        return {"ctx": (ctx - cm) / cs, "act": ds.actions[:, : ds.exec_steps].flatten(1), "y": (y - ym) / ys}

    def fit(self, ds) -> Dict[str, float]:
        """Train both scorers with InfoNCE on ``ds`` (the target mix itself, or trusted data
        such as the clean pretraining set: see the module docstring)."""
        c = self.config
        torch.manual_seed(c.seed)
        t0 = time.perf_counter()
        if hasattr(self, "norm"):
            del self.norm
        f = self.features(ds)
        pools = PoolBuilder(f["ctx"], ds.columns["episode"], ds.columns["task"], c.neighbours, c.pool)
        dims = (f["ctx"].shape[1], f["act"].shape[1], f["y"].shape[1])
        self.full = TransitionScorer(*dims, c.hidden, c.emb, use_action=True)
        self.abl = TransitionScorer(*dims, c.hidden, c.emb, use_action=False) if c.ablate else None
        nets = [m for m in (self.full, self.abl) if m is not None]
        opt = torch.optim.Adam([p for m in nets for p in m.parameters()], lr=c.lr)
        g = torch.Generator().manual_seed(c.seed)
        n = len(ds)
        zero = torch.zeros(c.batch, dtype=torch.long)
        for step in range(c.steps):
            anchors = torch.randint(0, n, (c.batch,), generator=g)
            cand = torch.cat([anchors[:, None], pools.negatives(anchors, c.k, g)], 1)
            pool = f["y"][cand]
            loss = sum(info_nce_loss(m.logits(f["ctx"][anchors], f["act"][anchors], pool), zero).mean() for m in nets)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {"scorer/fit_s": time.perf_counter() - t0, "scorer/final_loss": float(loss.detach()) / len(nets)}

    @torch.no_grad()
    def log_scores(self, ds) -> Dict[str, Tensor]:
        """Per window: log r_full, log r_ablated (averaged over pool draws), top-1 accuracies."""
        c, f = self.config, self.features(ds)
        pools = PoolBuilder(f["ctx"], ds.columns["episode"], ds.columns["task"], c.neighbours, c.pool)
        n = len(ds)
        g = torch.Generator().manual_seed(c.seed + 1)
        out = {k: torch.zeros(n) for k in ("log_r_full", "log_r_abl", "acc_full", "acc_abl")}
        for _ in range(c.eval_draws):
            for s in range(0, n, 2048):
                a = torch.arange(s, min(n, s + 2048))
                cand = torch.cat([a[:, None], pools.negatives(a, c.k, g)], 1)
                pool = f["y"][cand]
                for name, m in (("full", self.full), ("abl", self.abl)):
                    if m is None:
                        continue
                    lg = m.logits(f["ctx"][a], f["act"][a], pool)
                    log_r = math.log(c.k) + torch.log_softmax(lg.float(), 1)[:, 0]  # log(K * posterior), no underflow
                    out[f"log_r_{name}"][a] += log_r.clamp(min=-30.0) / c.eval_draws
                    out[f"acc_{name}"][a] += (lg.argmax(1) == 0).float() / c.eval_draws
        return out

    def score(self, ds) -> Dict[str, Tensor]:
        """{"r": calibrated PTR score [N], "raw": uncalibrated log score [N], ...}."""
        c = self.config
        s = self.log_scores(ds)
        raw = s["log_r_full"] - (s["log_r_abl"] if self.abl is not None else 0.0)
        smooth = episode_mean(raw, ds.columns["episode"]) if c.smooth == "episode" else raw
        r = calibrate(smooth, c.calibration, c.ratio, c.q_lo, c.q_hi, c.ess_target)
        return {"r": r, "raw": raw, "smoothed": smooth, **s}

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Tensor]:
        out = {f"full.{k}": v for k, v in self.full.state_dict().items()}
        if self.abl is not None:
            out.update({f"abl.{k}": v for k, v in self.abl.state_dict().items()})
        for name, v in zip(("ctx_mean", "ctx_std", "y_mean", "y_std"), self.norm):
            out[f"norm.{name}"] = v
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def load_state_dict(self, state: Dict[str, Tensor], dims: Sequence[int]) -> None:
        """Rebuild both scorers (input sizes ``dims`` = (context, action, target)) from ``state``."""
        c = self.config
        self.full = TransitionScorer(*dims, c.hidden, c.emb, use_action=True)
        self.full.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("full.")})
        self.abl = None
        if c.ablate:
            self.abl = TransitionScorer(*dims, c.hidden, c.emb, use_action=False)
            self.abl.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("abl.")})
        self.norm = tuple(state[f"norm.{n}"] for n in ("ctx_mean", "ctx_std", "y_mean", "y_std"))


def episode_mean(x: Tensor, episode: Tensor) -> Tensor:
    """[N] -> [N]: every window gets the mean of ``x`` over its episode (episode ids are
    dataset bookkeeping, not source labels)."""
    m = int(episode.max()) + 1
    tot = torch.zeros(m, dtype=torch.float64).index_add_(0, episode, x.double())
    cnt = torch.zeros(m, dtype=torch.float64).index_add_(0, episode, torch.ones_like(x, dtype=torch.float64))
    return (tot / cnt.clamp(min=1))[episode].to(x.dtype)


def _ranks(x: Tensor) -> Tensor:
    """[N] average ranks in (0, 1) (ties share their mean rank)."""
    n = x.numel()
    order = torch.argsort(x, stable=True)
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = torch.arange(n, dtype=torch.float64)
    uniq, inv = torch.unique(x, return_inverse=True)
    sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, ranks)
    cnts = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, torch.ones(n, dtype=torch.float64))
    return ((sums / cnts)[inv] + 0.5) / n


def calibrate(s: Tensor, mode: str, ratio: float, q_lo: float = 0.1, q_hi: float = 0.9,
              ess_target: float = 0.3) -> Tensor:
    """Map a (log-)score s [N] to a positive PTR ratio r [N] whose spread is set by the data.

    quantile  z = (s - Q(q_lo)) / (Q(q_hi) - Q(q_lo)) clipped to [0, 1]; r = ratio^(z - 1/2):
              the clip bounds are the q_lo / q_hi quantiles of s, which map to
              [ratio^-1/2, ratio^1/2] (so r spans exactly ``ratio``)
    rank      z = rank of s in (0, 1); r = ratio^(z - 1/2) (only the order of s matters)
    ess       z = s clipped to its [q_lo, q_hi] quantiles, standardised by that range;
              r = exp(beta z) with beta > 0 chosen (bisection) so that the effective sample
              size of r is ``ess_target`` (the weights concentrate on about that fraction
              of the data, whatever the scale of s); ``ratio`` is unused
    """
    s = s.double()
    lo, hi = torch.quantile(s, q_lo), torch.quantile(s, q_hi)
    span = (hi - lo).clamp(min=1e-9)
    if mode == "quantile":
        z = ((s - lo) / span).clamp(0.0, 1.0)
        return torch.exp(math.log(ratio) * (z - 0.5)).float()
    if mode == "rank":
        return torch.exp(math.log(ratio) * (_ranks(s) - 0.5)).float()
    if mode != "ess":
        raise ValueError("calibration must be quantile, rank or ess")
    z = (s.clamp(lo, hi) - lo) / span - 0.5
    ess = lambda b: float(effective_sample_size(torch.exp(b * z)))  # noqa: E731
    b_lo, b_hi = 0.0, 1.0
    while ess(b_hi) > ess_target and b_hi < 1e3:
        b_lo, b_hi = b_hi, b_hi * 2
    for _ in range(50):
        mid = 0.5 * (b_lo + b_hi)
        b_lo, b_hi = (mid, b_hi) if ess(mid) > ess_target else (b_lo, mid)
    r = torch.exp(b_hi * z)
    return (r / r.mean()).float()  # scale-free in the loss; mean 1 like a posterior-to-uniform ratio


def diagnostics(weights: Tensor, source: Tensor, scores: Optional[Dict[str, Tensor]] = None,
                clean: Sequence[str] = ("clean",)) -> Dict[str, float]:
    """AUROC (clean vs corrupted), ESS, weight mass and mean weight per source, scorer accuracy."""
    names = [SOURCES[int(i)] for i in source]
    is_clean = torch.tensor([n in clean for n in names])
    out = {"ptr/auroc_clean_vs_corrupted": auroc(weights, is_clean), "ptr/ess": effective_sample_size(weights)}
    total = float(weights.sum())
    for i, s in enumerate(SOURCES):
        m = source == i
        if bool(m.any()):
            out[f"ptr/mass/{s}"] = float(weights[m].sum()) / total
            out[f"ptr/share/{s}"] = float(m.float().mean())
            out[f"ptr/mean_w/{s}"] = float(weights[m].mean())
            if scores is not None:
                out[f"ptr/raw/{s}"] = float(scores["raw"][m].mean())
                out[f"scorer/acc_full/{s}"] = float(scores["acc_full"][m].mean())
                if "acc_abl" in scores:
                    out[f"scorer/acc_abl/{s}"] = float(scores["acc_abl"][m].mean())
    if scores is not None:
        out["scorer/acc_full"] = float(scores["acc_full"].mean())
        out["scorer/acc_abl"] = float(scores["acc_abl"].mean())
        out["ptr/auroc_raw_windows"] = auroc(scores["raw"], is_clean)
        out["ptr/auroc_full_only"] = auroc(scores["log_r_full"], is_clean)
    return out
