"""The one Trainer: the only code that touches accelerate.

Online iteration (GRPO family, FDFO):
    items -> rollout (old policy, per-sample generators) -> rewards -> gather over
    processes -> advantages (algorithm, global) -> training units -> inner epochs of
    shared-seed shuffled minibatches, each rank taking a strided share -> optimizer steps.
Offline iteration (flow matching, PTR): dataset batch -> per-sample weights -> weighted
regression.

Losses are reduced as sum(unit losses) / sum(unit norms over the GLOBAL minibatch), and
DDP averages over ranks, so a run gives the same numbers on 1 or N processes.
The trainer never learns which modality it trains: everything modality-specific comes
from the head, the rewards, the data source and the environment.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import yaml

from flowrl import rng
from flowrl.algorithms.base import Policy
from flowrl.config import TrainConfig, config_to_dict
from flowrl.data import ItemSource, OfflineDataset, epoch_indices
from flowrl.mdp import DenoisingChain, sample_chain, time_grid
from flowrl.registry import ALGORITHMS, DATASETS, ENVIRONMENTS, HEADS, ConfigError
from flowrl.samplers import SamplerConfig, build_sampler
from flowrl.trainer import checkpoint as ckpt
from flowrl.trainer import closed_loop
from flowrl.trainer.checks import check_correlated_noise, check_trained_steps_are_noisy
from flowrl.trainer.ema import EMA
from flowrl.trainer.logging import MetricsLogger, plot_curves
from flowrl.trainer.report import format_report, group_means, round_metrics
from flowrl.types import Trajectory
from rewards import CompositeReward

Tensor = torch.Tensor
RUN_FILES = ("metrics.jsonl", "checkpoints", "final", "report.json", "config.yaml", "eval_before.json")


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - frac
    return 0.5 * (1 + math.cos(math.pi * frac))


def eval_sampler_config(cfg: SamplerConfig) -> SamplerConfig:
    """The deterministic version of a training sampler (ODE for flows, DDIM eta = 0)."""
    if cfg.name == "ddim":
        return SamplerConfig(name="ddim", eta=0.0)
    return SamplerConfig(name="euler", eta=0.0)


class Trainer:
    def __init__(self, config: TrainConfig, *, for_eval: bool = False):
        from accelerate import Accelerator

        self.cfg = config
        c = config
        precision = "no" if c.train.mixed_precision == "fp32" else c.train.mixed_precision
        self.accelerator = Accelerator(mixed_precision=precision, cpu=c.train.cpu)
        expected = int(os.environ.get("WORLD_SIZE", "1"))
        if self.accelerator.num_processes != expected:
            raise RuntimeError(f"launched {expected} processes but accelerate formed a group of "
                               f"{self.accelerator.num_processes}; use --multi_gpu (with ACCELERATE_USE_CPU=true on CPU)")
        self.world = self.accelerator.num_processes
        self.rank = self.accelerator.process_index
        self.device = self.accelerator.device

        torch.manual_seed(c.seed)  # anything a builder draws from the global RNG is reproducible
        self.head = HEADS.get(c.head.name).builder(c.head)
        self.algorithm = ALGORITHMS.get(c.algorithm.name).builder(c.algorithm)
        ref = self.algorithm.reference_weight
        if ref and not self.head.has_reference:
            raise ConfigError(f"algorithm.{ref}: {c.algorithm.name} compares with the starting policy, which head "
                              f"{c.head.name} cannot give here ({self.head.reference_hint}); set algorithm.{ref}=0")
        alphas = getattr(self.head, "alphas_cumprod", None)
        self.sampler = build_sampler(c.sampler, alphas)
        self.ode_sampler = build_sampler(eval_sampler_config(c.sampler), alphas)  # also chain.ode_outside_window's
        self.eval_sampler = self.ode_sampler if c.eval.deterministic else self.sampler
        if self.sampler.prediction != self.head.prediction:
            raise ConfigError(f"sampler.name: {c.sampler.name} expects {self.sampler.prediction} predictions but head "
                              f"{c.head.name} predicts {self.head.prediction}; pick a matching sampler")
        self.chain = DenoisingChain(c.chain, times=self.head.time_grid(c.chain.num_steps))
        self.data = DATASETS.get(c.data.name).builder(c.data)
        if self.algorithm.offline and not isinstance(self.data, OfflineDataset):
            raise ConfigError(f"data.name: {c.algorithm.name} trains offline; choose a dataset source, not {c.data.name}")
        if not self.algorithm.offline and not isinstance(self.data, ItemSource):
            raise ConfigError(f"data.name: {c.algorithm.name} trains online; choose a prompt/scene source, not {c.data.name}")
        self.env = ENVIRONMENTS.get(c.env.name).builder(c.env) if c.env is not None else None
        if hasattr(self.env, "check_head"):  # an environment that cannot be driven by this head says so now
            self.env.check_head(self.head)
        if c.eval.best_of > 1 and not hasattr(self.env, "score_candidates"):
            raise ConfigError("eval.best_of > 1 needs a closed-loop environment that scores candidates "
                              "(env with score_candidates); set eval.best_of: 1")
        if c.sampler.noise_corr > 0:
            check_correlated_noise(c, self.head, self.data)
        if getattr(self.algorithm, "stochastic_sampler", None) is True:
            check_trained_steps_are_noisy(self.chain, self.sampler, c.sampler.name)
        self.reward = CompositeReward(c.rewards) if c.rewards else None
        label = lambda r: r.label or r.name  # noqa: E731
        eval_cfgs = list(c.rewards) + [m for m in c.eval.metrics if label(m) not in {label(r) for r in c.rewards}]
        self.eval_reward = CompositeReward(eval_cfgs) if eval_cfgs else None

        self.head.to(self.device)
        self.named_trainable = {k: p for k, p in self.head.named_parameters() if p.requires_grad}
        if not self.named_trainable and not for_eval:
            raise ConfigError(f"head: {c.head.name} has no trainable parameters; enable LoRA or full fine-tuning")
        self.optimizer = None
        if self.named_trainable:
            self.optimizer = torch.optim.AdamW(list(self.named_trainable.values()), lr=c.optim.lr,
                                               betas=tuple(c.optim.betas), eps=c.optim.adam_eps,
                                               weight_decay=c.optim.weight_decay)
            self.model, self.optimizer = self.accelerator.prepare(self.head, self.optimizer)
        else:
            self.model = self.head
        self.ema = EMA(self.named_trainable, c.train.ema_decay) if c.train.ema_decay > 0 else None
        self.policy = Policy(velocity=self.model, reference_velocity=self._reference_velocity,
                             sampler=self.sampler, event_ndim=self.head.event_ndim, prediction=self.head.prediction)
        self.iteration = 0
        self.opt_step = 0
        self.is_main = self.accelerator.is_main_process

    def _reference_velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """The reference policy under the same autocast as the trained one (KL terms compare like with like)."""
        with self.accelerator.autocast():
            return self.head.reference_velocity(x, t, cond)

    # ------------------------------------------------------------------ utilities
    def _gather(self, x: Tensor) -> Tensor:
        if self.world == 1:
            return x
        if x.dtype == torch.bool:
            return self.accelerator.gather(x.to(self.device).to(torch.uint8)).bool()
        return self.accelerator.gather(x.to(self.device).contiguous())

    def _all_sum(self, x: Tensor) -> Tensor:
        x = x.to(self.device)
        return self.accelerator.reduce(x, reduction="sum") if self.world > 1 else x

    def _share(self, n: int) -> range:
        if n % self.world:
            raise ConfigError(f"train.prompts_per_step: the global batch of {n} samples does not split over "
                              f"{self.world} processes; make it a multiple of {self.world}")
        k = n // self.world
        return range(self.rank * k, (self.rank + 1) * k)

    def _to_device(self, tree: Dict[str, Tensor]) -> Dict[str, Tensor]:
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in tree.items()}

    # ------------------------------------------------------------------ rollout
    @torch.no_grad()
    def _rollout(self, items: Sequence[Any], init_gens, chain_gens, sampler, times,
                 stochastic: Optional[Tensor] = None) -> Dict[str, Any]:
        """Chains for a local batch, chunked by train.rollout_batch_size; ``stochastic``: the
        [K] steps sampled with noise (``DenoisingChain.stochastic_steps``), None = all."""
        n = len(items)
        size = self.cfg.train.rollout_batch_size or n
        parts = []
        for s in range(0, n, size):
            sl = slice(s, min(n, s + size))
            cond = self._to_device(self.head.encode(items[sl]))
            x0 = self.head.init_noise(cond, init_gens[sl]).to(self.device)
            # through the prepared model (DDP/FSDP wrapper, autocast) so that rollout and
            # update compute the same log-probs
            res = sample_chain(self.model, sampler, x0, cond, times, chain_gens[sl],
                               record_velocity=self.algorithm.record_velocity, event_ndim=self.head.event_ndim,
                               stochastic=stochastic, ode_sampler=self.ode_sampler)
            res["cond"] = cond
            parts.append(res)
        cat = lambda key: None if parts[0][key] is None else torch.cat([p[key] for p in parts])  # noqa: E731
        out = {k: cat(k) for k in ("states", "times", "log_probs", "velocities")}
        out["cond"] = {k: torch.cat([p["cond"][k] for p in parts]) for k in parts[0]["cond"]}
        return out

    def _rollout_closed_loop(self, it: int, items, samples: Sequence[int], group: int, group_ids: Tensor,
                             sample_ids: Tensor):
        return closed_loop.rollout(self, it, items, samples, group, group_ids, sample_ids)

    def _generators(self, it: int, samples: Sequence[int], group: int, shared: bool):
        c = self.cfg
        init, chain = [], []
        for j in samples:
            p, m = divmod(j, group)
            init.append(rng.generator(c.seed, rng.STREAM_INIT, it, p, -1 if shared else m))
            chain.append(rng.generator(c.seed, rng.STREAM_CHAIN, it, p, m))
        return init, chain

    def collect(self, it: int) -> Tuple[Trajectory, Dict[str, Tensor], Dict[str, Tensor], Dict[str, float]]:
        """Roll out this process's share of iteration ``it`` and gather the whole batch."""
        c = self.cfg
        g = self.algorithm.group_size
        train_items = self.data.train_items()
        n_prompts = c.train.prompts_per_step
        n = n_prompts * g
        prompt_idx = epoch_indices(c.seed, it, n_prompts, len(train_items))
        local = list(self._share(n))
        items = [train_items[int(prompt_idx[j // g])] for j in local]
        local_t = torch.tensor(local, dtype=torch.long)
        group_ids, sample_ids = it * n_prompts + local_t // g, it * n + local_t
        if self.env is not None:
            res, scored, group_ids, sample_ids = self._rollout_closed_loop(it, items, local, g, group_ids, sample_ids)
        else:
            init_g, chain_g = self._generators(it, local, g, self.algorithm.shared_init_noise)
            res = self._rollout(items, init_g, chain_g, self.sampler, self.chain.times, self.chain.stochastic_steps(it))
            outputs = self.head.decode(res["states"][:, -1], res["cond"])
            scored = self.reward(outputs, items)
        traj = Trajectory(
            states=res["states"], times=res["times"], cond=res["cond"],
            group_ids=group_ids, sample_ids=sample_ids,
            log_probs=res["log_probs"], velocities=res["velocities"],
            rewards=scored.total.to(self.device), valid=scored.valid.to(self.device),
        )
        traj = traj.map_tensors(self._gather)
        per = {k: self._gather(v.to(self.device)).cpu() for k, v in scored.per_reward.items()}
        per_valid = {k: self._gather(v.to(self.device)).cpu() for k, v in scored.per_valid.items()}
        metrics = {}
        for name in per:
            v = per_valid[name]
            metrics[f"reward/{name}"] = float(per[name][v].mean()) if bool(v.any()) else float("nan")
            metrics[f"reward/{name}_invalid_frac"] = float((~v).float().mean())
        metrics.update({k: v for k, v in scored.metrics.items() if k.endswith("_failures")})
        if "episode_return" in scored.metrics:  # closed loop: the executed episodes' mean return
            metrics["reward/episode_return"] = float(self._all_sum(torch.tensor(
                scored.metrics["episode_return"] / self.world, dtype=torch.float64)))
        tv = traj.valid.cpu()
        metrics["reward/total"] = float(traj.rewards.cpu()[tv].mean()) if bool(tv.any()) else float("nan")
        return traj, per, per_valid, metrics

    # ------------------------------------------------------------------ update
    def _optimizer_step(self, units: Dict[str, Tensor], cond: Optional[Dict[str, Tensor]], local_idx: Tensor,
                        denom: Tensor, gen_base: Tuple[int, ...], unit_ids: Optional[Tensor] = None) -> Dict[str, float]:
        """One optimizer step on this process's share ``local_idx`` of a global minibatch."""
        c = self.cfg
        factor = lr_factor(self.opt_step, c.optim.warmup_steps, self._total_opt_steps(), c.optim.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = c.optim.lr * factor
        self.optimizer.zero_grad(set_to_none=True)
        empty = len(local_idx) == 0
        if empty:  # every rank must take part in the gradient all-reduce
            local_idx = torch.zeros(1, dtype=torch.long)
        micro = c.train.micro_batch_size or len(local_idx)
        chunks = list(torch.split(local_idx, micro))
        sums: Dict[str, Tensor] = {}
        count = torch.zeros((), dtype=torch.float64)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for i, idx in enumerate(chunks):
            sync = nullcontext() if i == len(chunks) - 1 else self.accelerator.no_sync(self.model)
            with sync:
                mb = {k: v[idx].to(self.device) for k, v in units.items()}
                cmb = {k: v[mb["sample_idx"]].to(self.device) for k, v in cond.items()} if cond is not None else {}
                ids = unit_ids[idx] if unit_ids is not None else idx
                gens = rng.generators(gen_base, ids.tolist()) if self.algorithm.draws_noise else None
                per_unit, metrics = self.algorithm.loss(mb, cmb, self.policy, gens)
                scale = 0.0 if empty else float(self.world)
                loss = per_unit.sum() / denom * scale
                self.accelerator.backward(loss)
            if not empty:
                loss_sum += float(per_unit.detach().sum())
                count += len(idx)
                for k, m in metrics.items():
                    sums[k] = sums.get(k, torch.zeros((), dtype=torch.float64)) + float(m.float().sum())
        grad_norm = float("nan")
        params = list(self.named_trainable.values())
        if c.optim.grad_clip > 0:
            grad_norm = float(self.accelerator.clip_grad_norm_(params, c.optim.grad_clip))
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update()
        self.opt_step += 1
        keys = sorted(sums)
        packed = torch.tensor([float(loss_sum), float(count)] + [float(sums[k]) for k in keys], dtype=torch.float64)
        packed = self._all_sum(packed).cpu()
        total = max(float(packed[1]), 1.0)
        out = {"loss": float(packed[0]) / float(denom) if float(denom) > 0 else 0.0,
               "lr": c.optim.lr * factor, "grad_norm": grad_norm, "units": float(packed[1])}
        out.update({k: float(v) / total for k, v in zip(keys, packed[2:])})
        return out

    def _total_opt_steps(self) -> int:
        a = self.algorithm.config
        per_it = 1 if self.algorithm.offline else a.inner_epochs * a.num_minibatches
        return self.cfg.max_steps * per_it

    def train_iteration_online(self, it: int) -> List[Dict[str, float]]:
        c = self.cfg
        t0 = time.perf_counter()
        traj, per, per_valid, metrics = self.collect(it)
        traj = traj.map_tensors(lambda x: x.cpu())
        weights = self.reward.weights if self.reward is not None else {k: 1.0 for k in per}
        traj, adv_metrics = self.algorithm.compute_advantages(traj, per, per_valid, weights)
        metrics.update(adv_metrics)
        rollout_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        steps = self.chain.trainable_steps(it, rng.generator(c.seed, rng.STREAM_TIME, it))
        units = self.algorithm.make_units(traj, steps)
        norms = self.algorithm.unit_norm(units)
        n_units = len(norms)
        rows = []
        a = self.algorithm.config
        if n_units == 0:  # every group dropped / invalid: nothing to learn from this batch
            metrics.update({"perf/rollout_s": rollout_s, "perf/update_s": 0.0, "units": 0.0})
            self.opt_step += a.inner_epochs * a.num_minibatches
            return [{**metrics, "step": self.opt_step, "iteration": it + 1, "skipped": 1.0}]
        for epoch in range(a.inner_epochs):
            perm = torch.randperm(n_units, generator=rng.generator(c.seed, rng.STREAM_SHUFFLE, it, epoch))
            for mb_i, chunk in enumerate(torch.tensor_split(perm, a.num_minibatches)):
                local = chunk[self.rank::self.world]
                denom = norms[chunk].sum().clamp(min=1e-12)
                row = self._optimizer_step(units, traj.cond, local, denom, (c.seed, rng.STREAM_TIME, it, epoch, mb_i))
                rows.append(row)
        update_s = time.perf_counter() - t1
        out = []
        for row in rows:
            out.append({**metrics, **row, "perf/rollout_s": rollout_s, "perf/update_s": update_s, "iteration": it + 1})
        step0 = self.opt_step - len(rows)
        for i, row in enumerate(out):
            row["step"] = step0 + i + 1
        return out

    def train_iteration_offline(self, it: int) -> List[Dict[str, float]]:
        c = self.cfg
        t0 = time.perf_counter()
        n = c.train.batch_size
        global_idx = epoch_indices(c.seed, it, n, len(self.data))
        local = torch.tensor(list(self._share(n)), dtype=torch.long)
        items, x0, columns = self.data.get(global_idx[local])
        cond = self._to_device(self.head.encode(items))
        units = self.algorithm.make_offline_units(x0, columns)
        norms = self.algorithm.unit_norm(units)
        denom = self._all_sum(norms.sum().double()).cpu().clamp(min=1e-12)
        row = self._optimizer_step(units, cond, torch.arange(len(local)), denom, (c.seed, rng.STREAM_TIME, it),
                                   unit_ids=it * n + local)
        row.update({"step": self.opt_step, "iteration": it + 1, "perf/update_s": time.perf_counter() - t0})
        return [row]

    # ------------------------------------------------------------------ evaluation
    def eval_plan(self, seed: int, all_ranks: bool = False):
        """The fixed evaluation set: (sample indices, items, init generators, chain generators).

        Sample j is item j // samples_per_item; its noise comes from (seed, j) only, so
        ``flowrl eval`` and ``flowrl sample`` see the same samples on any number of processes.
        """
        c = self.cfg
        all_items = list(self.data.eval_items())[: c.eval.num_items]
        spi = c.eval.samples_per_item
        total = len(all_items) * spi
        mine = list(range(total)) if all_ranks else list(range(self.rank, total, self.world))
        items = [all_items[j // spi] for j in mine]
        init = [rng.generator(seed, rng.STREAM_EVAL, j // spi, j % spi, 0) for j in mine]
        chain = [rng.generator(seed, rng.STREAM_EVAL, j // spi, j % spi, 1) for j in mine]
        return mine, items, init, chain

    def eval_times(self) -> Tensor:
        c = self.cfg
        steps = c.eval.num_steps or c.chain.num_steps
        head_grid = self.head.time_grid(steps) if c.chain.shift is None else None
        return head_grid.float() if head_grid is not None else time_grid(steps, c.chain.shift)

    @torch.no_grad()
    def sample(self, seed: Optional[int] = None) -> Tuple[List[Any], Tensor]:
        """All evaluation samples on this process: (items, final states [N, ...])."""
        _, items, init, chain = self.eval_plan(self.cfg.eval.seed if seed is None else seed, all_ranks=True)
        ctx = self.ema.applied() if self.ema is not None else nullcontext()
        with ctx:
            res = self._rollout(items, init, chain, self.eval_sampler, self.eval_times())
        return items, res["states"][:, -1]

    @torch.no_grad()
    def evaluate(self, seed: Optional[int] = None, tag: Optional[str] = None) -> Dict[str, float]:
        """Fixed evaluation: eval items x samples_per_item, deterministic sampler, eval seeds.

        ``tag`` names the sample grid a head may write (default ``step-<iteration>``)."""
        c = self.cfg
        seed = c.eval.seed if seed is None else seed
        if self.env is not None:
            return self._evaluate_closed_loop(seed, tag)
        if self.eval_reward is None:
            return {}
        mine, items, init, chain = self.eval_plan(seed)
        times = self.eval_times()
        names = self.eval_reward.names
        sums: Dict[str, List[float]] = {name: [0.0, 0.0] for name in names}  # key -> [score sum, valid count]
        ctx = self.ema.applied() if self.ema is not None else nullcontext()
        with ctx:
            if items:
                res = self._rollout(items, init, chain, self.eval_sampler, times)
                outputs = self.head.decode(res["states"][:, -1], res["cond"])
                scored = self.eval_reward(outputs, items)
                for name in names:
                    ok = scored.per_valid[name].reshape(len(items), -1).all(dim=1)
                    score = scored.per_reward[name].reshape(len(items), -1).double().mean(dim=1)
                    labels = scored.groups.get(name, [None] * len(items))
                    for i, (s_i, ok_i, g) in enumerate(zip(score.tolist(), ok.tolist(), labels)):
                        for key in ([name] if g is None else [name, f"{name}/{g}"]):
                            acc = sums.setdefault(key, [0.0, 0.0])
                            acc[0] += s_i if ok_i else 0.0
                            acc[1] += float(ok_i)
        if hasattr(self.head, "save_samples"):
            self._save_sample_grid(mine, items, outputs if items else None, tag or f"step-{self.iteration:06d}")
        return group_means(self._all_sum_dict(sums), names)

    def _all_sum_dict(self, sums: Dict[str, List[float]]) -> Dict[str, List[float]]:
        """Sum {key: [a, b]} over processes (keys may differ between ranks)."""
        if self.world == 1:
            return sums
        from accelerate.utils import gather_object

        total: Dict[str, List[float]] = {}
        for part in gather_object([sums]):
            for k, (a, b) in part.items():
                acc = total.setdefault(k, [0.0, 0.0])
                acc[0] += a
                acc[1] += b
        return total

    def _save_sample_grid(self, mine: List[int], items: List[Any], outputs: Optional[Tensor], tag: str) -> None:
        """Gather every rank's evaluation outputs in global order and let the head draw them."""
        parts = [(mine, items, outputs.cpu() if outputs is not None else None)]
        if self.world > 1:
            from accelerate.utils import gather_object

            parts = gather_object(parts)
        if self.is_main:
            rows = sorted(((j, it, out[i]) for idx, its, out in parts if out is not None
                           for i, (j, it) in enumerate(zip(idx, its))), key=lambda r: r[0])
            if rows:
                self.head.save_samples(torch.stack([r[2] for r in rows]), [r[1] for r in rows],
                                       self.cfg.output_dir, tag)

    def _evaluate_closed_loop(self, seed: int, tag: Optional[str] = None) -> Dict[str, float]:
        return closed_loop.evaluate(self, seed, tag)

    # ------------------------------------------------------------------ run
    def _prepare_output_dir(self) -> Optional[str]:
        """Check output_dir before writing anything; returns the checkpoint to resume from."""
        c = self.cfg
        out = c.output_dir
        if os.path.exists(out) and not os.path.isdir(out):
            raise ConfigError(f"output_dir: {out} is a file; pass a directory path")
        root = os.path.join(out, "checkpoints")
        resume_from = ckpt.latest_checkpoint(root) if c.resume else None
        has_run = os.path.isdir(out) and any(os.path.exists(os.path.join(out, f)) for f in RUN_FILES)
        if has_run and c.resume and resume_from is None and not c.overwrite:
            raise ConfigError(f"resume: {out} holds no complete checkpoint to resume from; "
                              f"set overwrite=true to start over there, or choose another output_dir")
        if has_run and resume_from is None and not c.overwrite:
            raise ConfigError(f"output_dir: {out} already holds a run; set resume=true to continue it, "
                              f"overwrite=true to replace it, or choose another output_dir")
        return resume_from

    def _resume(self, path: str) -> None:
        state = ckpt.read_checkpoint(path)
        self.head.load_trainable_state_dict(state["trainable"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if state["rng"] is not None:
            torch.set_rng_state(state["rng"]["torch"])
        s = state["state"]
        self.iteration, self.opt_step = int(s["iteration"]), int(s["opt_step"])
        self.algorithm.load_state_dict(s.get("algorithm", {}))

    def save_checkpoint(self) -> None:
        if self.is_main:
            c = self.cfg
            state = {"iteration": self.iteration, "opt_step": self.opt_step,
                     "algorithm": self.algorithm.state_dict(), "world_size": self.world}
            ckpt.write_checkpoint(os.path.join(c.output_dir, "checkpoints"), self.iteration,
                                  trainable=self.head.trainable_state_dict(),
                                  optimizer=self.optimizer.state_dict(), state=state,
                                  ema=self.ema.state_dict() if self.ema is not None else None,
                                  keep=c.train.keep_checkpoints)
        self.accelerator.wait_for_everyone()

    def save_final(self) -> None:
        if self.is_main:
            out = os.path.join(self.cfg.output_dir, "final")
            tmp = out + f".tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            ctx = self.ema.applied() if self.ema is not None else nullcontext()
            with ctx:
                self.head.save_pretrained(tmp)
                ckpt.save_tensors(self.head.trainable_state_dict(), os.path.join(tmp, "trainable.safetensors"))
            ckpt.replace_dir(tmp, out)
        self.accelerator.wait_for_everyone()

    def train(self) -> Dict[str, Any]:
        c = self.cfg
        # every rank inspects output_dir before any rank writes to it, so all decide alike
        resume_from = self._prepare_output_dir()
        self.accelerator.wait_for_everyone()
        out = c.output_dir
        if self.is_main:
            if not resume_from and c.overwrite and os.path.isdir(out):
                for f in RUN_FILES + ("tb",):
                    p = os.path.join(out, f)
                    shutil.rmtree(p) if os.path.isdir(p) else (os.remove(p) if os.path.exists(p) else None)
            os.makedirs(out, exist_ok=True)
            ckpt.atomic_write_text(os.path.join(out, "config.yaml"),
                                   yaml.safe_dump(config_to_dict(c), sort_keys=False))
        self.accelerator.wait_for_everyone()
        logger = MetricsLogger(out, c.train.tensorboard) if self.is_main else None
        before_path = os.path.join(out, "eval_before.json")
        if resume_from:
            self._resume(resume_from)
            if logger:
                logger.truncate_after(self.opt_step)
            before = json.load(open(before_path)) if os.path.isfile(before_path) else self.evaluate()
        else:
            before = self.evaluate(tag="before")
            if self.is_main:
                ckpt.atomic_write_text(before_path, json.dumps(before, indent=2))
        if self.is_main:
            print(f"[flowrl] {self.world} process(es) on {self.device}; iteration {self.iteration}/{c.max_steps}", flush=True)
            print(f"[flowrl] before: {json.dumps(round_metrics(before))}", flush=True)
        bar = None
        if self.is_main and c.train.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=c.max_steps, initial=self.iteration, desc="train", dynamic_ncols=True)
        step_fn = self.train_iteration_offline if self.algorithm.offline else self.train_iteration_online
        while self.iteration < c.max_steps:
            rows = step_fn(self.iteration)
            self.iteration += 1
            if c.train.eval_every and self.iteration % c.train.eval_every == 0 and self.iteration < c.max_steps:
                ev = self.evaluate()
                rows[-1].update({f"eval/{k}": v for k, v in ev.items()})
            if logger:
                for row in rows:
                    logger.log(row)
            if bar is not None:
                last = rows[-1]
                bar.set_postfix({k: f"{last[k]:.3f}" for k in ("reward/total", "loss") if isinstance(last.get(k), float)})
                bar.update(1)
            if c.train.checkpoint_every and self.iteration % c.train.checkpoint_every == 0 and self.iteration < c.max_steps:
                self.save_checkpoint()
        if bar is not None:
            bar.close()
        self.save_checkpoint()
        self.save_final()
        after = self.evaluate(tag="after")
        report = {"before": before, "after": after}
        if self.is_main and hasattr(self.data, "report"):
            report["data"] = self.data.report(out)  # optional hook: the source's own diagnostics
        if self.is_main:
            ckpt.atomic_write_text(os.path.join(out, "report.json"), json.dumps(report, indent=2))
            if c.train.curves:
                plot_curves(out, before, after, self.iteration)
            print(f"[flowrl] after:  {json.dumps(round_metrics(after))}", flush=True)
            print(format_report(report), flush=True)
        if logger:
            logger.close()
        return report

    def close(self) -> None:
        """End the run on every rank together: a last barrier, then the process group is
        destroyed (left to interpreter exit, gloo's threads can abort a rank)."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def load_for_eval(self, path: str) -> None:
        state = ckpt.read_checkpoint(path)
        weights = state["ema"] if state["ema"] is not None else state["trainable"]
        self.head.load_trainable_state_dict(weights)
        self.ema = None
