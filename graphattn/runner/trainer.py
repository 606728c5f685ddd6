"""One seed of one experiment: the :class:`Trainer` (training, evaluation, model selection on
validation, data-parallel ranks) and its checkpoints, written atomically and resumable
bit-for-bit (every random state the run consumes is saved with them)."""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from graphattn.consistency import consistency_loss
from graphattn.core.contract import EdgeProducer
from graphattn.core.index import default_batch
from graphattn.core.policy import ReinforceBaseline, per_graph_log_likelihood
from graphattn.data.store import atomic_torch_save
from graphattn.nn import GraphModel
from graphattn.runner import distributed as D
from graphattn.runner.build import build_model
from graphattn.runner.checkpoint import load_checkpoint
from graphattn.runner.config import DEFAULTS
from graphattn.runner.folders import check_resumable
from graphattn.runner.metrics import METRICS, task_loss, task_metric
from graphattn.runner.tasks import Task

CHECKPOINT_VERSION = 2


# the runner seeds, saves and restores numpy's legacy global RNG state (NPY002) for bit-exact
# resumption
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state(loader_gen: torch.Generator, device: torch.device | None = None) -> dict[str, Any]:
    """Every random state a run consumes, as tensors and plain Python values (checkpoints load
    with ``weights_only=True``); on a CUDA ``device`` also its generator (dropout, sampling)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                       float(gauss)],
             "loader": loader_gen.get_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], loader_gen: torch.Generator,
                   device: torch.device | None = None) -> None:
    # a checkpoint loaded with map_location=<cuda> has its state tensors on the GPU: the CPU
    # generators (and numpy) take CPU byte tensors only
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    loader_gen.set_state(state["loader"].cpu())
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


class _TrainingForward(nn.Module):
    """What :class:`~torch.nn.parallel.DistributedDataParallel` wraps: the model's training
    forward, returning the predictions, the signals and, as a list, every tensor the signals carry
    (auxiliary losses, log-probabilities), so that DDP finds every output the loss may use."""

    def __init__(self, model: GraphModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> tuple[Tensor, Any, list[Tensor]]:
        out, signals = self.model(batch, return_signals=True)
        carried = [t for es in signals.edge_sets
                   for t in (es.aux_loss, es.log_prob, es.log_prob_graph) if t is not None]
        return out, signals, carried


#: rank r's random streams (dropout, sampled edges) are seeded with ``seed + RANK_STREAM * r``
RANK_STREAM = 1_000_003


class Trainer:
    """One seed of one experiment. With ``world`` (a process group set up by
    :func:`graphattn.runner.distributed.setup`), one rank of a data-parallel run: the model is
    wrapped in :class:`~torch.nn.parallel.DistributedDataParallel`, each rank trains on its share
    of every global batch, metrics are computed on the whole split gathered from all ranks, and
    rank 0 writes the checkpoints (with every rank's random state)."""

    def __init__(self, cfg: dict[str, Any], task: Task, seed: int, out_dir: Path | None,
                 world: D.World | None = None, device: str | None = None) -> None:
        self.cfg, self.task, self.seed, self.world = cfg, task, seed, world
        if world is not None and task.level == "node":
            raise ValueError(f"distributed training takes graph-level tasks; {task.name!r} is a "
                             f"node task (train it in one process, with --loader neighbor for a "
                             f"large graph)")
        if cfg["loader"] == "neighbor" and task.level != "node":
            raise ValueError(f"--loader neighbor samples subgraphs of one large graph (node tasks); "
                             f"{task.name!r} is a graph-level task, batched whole")
        if cfg["consistency_samples"] > 1:
            if task.loss not in ("ce", "bce"):
                raise ValueError(f"--consistency-samples > 1 regularises class probabilities "
                                 f"(cross-entropy or binary cross-entropy tasks); {task.name!r} "
                                 f"is trained with the {task.loss!r} loss")
            if world is not None:
                raise ValueError("--consistency-samples > 1 runs several forward passes per step, "
                                 "which DistributedDataParallel does not allow; train in one "
                                 "process")
        self.out_dir = out_dir / f"seed{seed}" if out_dir is not None else None
        self.device = torch.device(device or cfg["device"])
        self.is_main = world is None or world.is_main
        _seed_everything(seed)
        self.model = build_model(cfg, task).to(self.device)
        self._materialise()
        self.ddp: nn.Module | None = None
        if world is not None:
            from torch.nn.parallel import DistributedDataParallel

            # find_unused_parameters: a producer may leave parameters out of a step (sampled
            # edges, a branch the batch does not reach); rank 0's initial weights are broadcast
            self.ddp = DistributedDataParallel(
                _TrainingForward(self.model), find_unused_parameters=True,
                device_ids=[self.device.index] if self.device.type == "cuda" else None)
        opt = torch.optim.AdamW if cfg["optimizer"] == "adamw" else torch.optim.Adam
        self.optimizer = opt(_param_groups(self.model, cfg), lr=cfg["lr"],
                             weight_decay=cfg["weight_decay"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.baseline = ReinforceBaseline(cfg["pg_momentum"])
        self.loader_gen = torch.Generator()
        self.loader_gen.manual_seed(seed)  # the same on every rank: one epoch order for all
        # the same RNG stream whatever the dry run consumed; each rank its own stream
        _seed_everything(seed + RANK_STREAM * (world.rank if world is not None else 0))
        self._neighbor_loader: Any = None
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.elapsed = 0.0
        self.budget_hit = False
        self.higher_is_better = METRICS[task.metric][1]

    # ---------------------------------------------------------------- set-up
    def _lr_factor(self, epoch: int) -> float:
        cfg = self.cfg
        warm = cfg["warmup_epochs"]
        if warm and epoch < warm:
            return (epoch + 1) / warm
        if cfg["scheduler"] == "cosine":
            t = (epoch - warm) / max(cfg["epochs"] - warm, 1)
            return 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
        return 1.0

    def _first_batch(self) -> Any:
        if self.task.level == "node":
            return self.task.graph
        ds = self.task.splits["train"]
        return next(iter(DataLoader(ds, batch_size=min(2, len(ds)), shuffle=False)))

    def _materialise(self) -> None:
        """Initialises lazy parameters with one evaluation-mode forward pass."""
        self.model.eval()
        with torch.no_grad():
            self.model(self._first_batch().to(self.device))
        self.n_params = sum(p.numel() for p in self.model.parameters())

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION, "config": self.cfg, "seed": self.seed,
            "epoch": self.epoch, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "baseline": self.baseline.state_dict(), "rng": _rng_state(self.loader_gen, self.device),
            "history": self.history, "best": self.best, "elapsed": self.elapsed,
        }

    def _rank_state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.loader_gen, self.device), "baseline": self.baseline.state_dict()}

    def save(self, name: str) -> None:
        """Writes the checkpoint ``name`` (rank 0; every rank takes part, giving its random state
        and REINFORCE baseline, which the checkpoint keeps per rank)."""
        ranks = D.gather_objects(self._rank_state(), self.world) if self.world is not None else None
        if self.out_dir is None or not self.is_main:
            return
        ck = self.checkpoint()
        if ranks is not None:
            ck["world_size"], ck["ranks"] = len(ranks), ranks
        atomic_torch_save(ck, self.out_dir / name)

    def resume(self) -> bool:
        path = self.out_dir / "last.pt" if self.out_dir is not None else None
        if path is None or not path.exists():
            return False
        ck = load_checkpoint(path, map_location=self.device)
        if ck.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"cannot resume {path}: it was written by checkpoint format "
                             f"{ck.get('version')}, this version reads {CHECKPOINT_VERSION}")
        # a key added to the config since the checkpoint was written had its default then
        check_resumable(self.cfg, {**DEFAULTS, **ck["config"]}, f"cannot resume: {path}")
        size = self.world.size if self.world is not None else 1
        if ck.get("world_size", 1) != size:
            raise ValueError(f"cannot resume {path}: it was written by a run of "
                             f"{ck.get('world_size', 1)} process(es), this one has {size} (each "
                             f"rank's random state is in the checkpoint; resume with as many)")
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        mine_state = ck["ranks"][self.world.rank] if self.world is not None else ck
        self.baseline.load_state_dict(mine_state["baseline"])
        _set_rng_state(mine_state["rng"], self.loader_gen, self.device)
        self.epoch, self.history, self.best = ck["epoch"], ck["history"], ck["best"]
        self.elapsed = ck["elapsed"]
        return True

    # ------------------------------------------------------------- training
    def _step_loss(self, batch: Any, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(objective, task loss, predictions)``: the optimised objective adds the auxiliary and
        policy-gradient terms to the task loss (which is logged on its own). With
        ``consistency_samples`` S > 1, S stochastic passes: the objective and the task loss are
        their means, plus ``consistency_weight`` × :func:`~graphattn.consistency.consistency_loss`
        over every row of the passes' outputs; the predictions are the first pass's."""
        samples = self.cfg["consistency_samples"]
        passes = [self._pass_loss(batch, mask) for _ in range(samples)]
        if samples == 1:
            return passes[0]
        loss = torch.stack([p[0] for p in passes]).mean()
        task_value = torch.stack([p[1] for p in passes]).mean()
        if self.cfg["consistency_weight"]:
            loss = loss + self.cfg["consistency_weight"] * consistency_loss(
                [p[2] for p in passes], self.cfg["consistency_temperature"], self.task.loss)
        return loss, task_value, passes[0][2]

    def _pass_loss(self, batch: Any, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One forward pass: ``(objective, task loss, predictions)``."""
        task, cfg = self.task, self.cfg
        if self.ddp is not None:
            out, signals, _ = self.ddp(batch)
        else:
            out, signals = self.model(batch, return_signals=True)
        if out.size(0) != batch.y.size(0):
            raise ValueError(f"the model returned {out.size(0)} predictions for {batch.y.size(0)} "
                             f"targets")
        y = batch.y
        loss = task_loss(task, out[mask] if mask is not None else out,
                         y[mask] if mask is not None else y)
        task_value = loss.detach()
        aux = signals.aux_loss
        if aux is not None and cfg["aux_weight"]:
            loss = loss + cfg["aux_weight"] * aux
        terms = signals.policy_terms
        if terms and cfg["pg_weight"]:
            if task.level == "node":
                graph = default_batch(None, out.size(0), out.device)
                rewards = per_graph_log_likelihood(task.loss, out.detach(), y, graph, 1, mask)
            else:
                graph = torch.arange(out.size(0), device=out.device)
                rewards = per_graph_log_likelihood(task.loss, out.detach(), y, graph, out.size(0))
            loss = loss + cfg["pg_weight"] * self.baseline.loss(terms, rewards)
        return loss, task_value, out

    def train_step(self, batch: Any, mask: Tensor | None = None,
                   weight: float = 1.0) -> tuple[float, float, Tensor]:
        """One optimizer step on ``batch`` (already on the device): forward, the objective,
        backward, gradient clipping, the optimizer. Returns ``(task loss, objective, predictions)``;
        a non-finite objective raises :class:`FloatingPointError` before any parameter changes.
        One device-to-host transfer (the two losses, for the check and the logs).

        In a distributed run the objective is scaled by ``weight`` (this rank's
        :func:`~graphattn.runner.distributed.loss_weight`) and the returned losses are those of the
        whole global batch (the mean over ranks of the scaled losses; every rank gets the same)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, task_value, out = self._step_loss(batch, mask)
        if weight != 1.0:
            loss, task_value = loss * weight, task_value * weight
        both = D.mean_over_ranks(torch.stack([task_value.detach(), loss.detach()]), self.world)
        task_f, objective_f = both.tolist()
        if not math.isfinite(objective_f):
            raise FloatingPointError(f"non-finite training loss at epoch {self.epoch + 1}")
        loss.backward()
        if self.cfg["grad_clip"]:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["grad_clip"])
        self.optimizer.step()
        return task_f, objective_f, out

    def _train_batches(self) -> tuple[Any, int]:
        """``(iterable of (batch, mask, loss weight), steps per epoch)``."""
        task, cfg = self.task, self.cfg
        if task.level == "node":
            if cfg["loader"] == "neighbor":
                loader = self._neighbors()
                return ((b, _seed_mask(b), 1.0) for b in loader), len(loader)
            return [(task.graph, task.graph.train_mask, 1.0)], 1
        train = task.splits["train"]
        if self.world is None:
            loader = DataLoader(train, batch_size=cfg["batch_size"], shuffle=True,
                                generator=self.loader_gen, drop_last=False)
            return ((b, None, 1.0) for b in loader), len(loader)
        sampler = D.RankShardSampler(train, cfg["batch_size"], self.loader_gen, self.world)
        # the loader draws from the generator as the single-process one does (its base seed, then
        # the epoch order), so both see the same global batches
        loader = DataLoader(train, batch_sampler=sampler, generator=self.loader_gen)
        n, size = len(train), cfg["batch_size"]
        return ((b, None, D.loss_weight(b.num_graphs, min(size, n - k * size), self.world))
                for k, b in enumerate(loader)), len(loader)

    def _neighbors(self) -> Any:
        """PyG's :class:`~torch_geometric.loader.NeighborLoader` over the training nodes: each
        batch is the subgraph sampled around ``batch_size`` seed nodes (``num_neighbors`` per hop;
        default 10 per layer), which the producers see as one graph; the loss is taken on the seed
        nodes. Built once per trainer; shuffled by the run's loader generator, neighbours drawn
        from torch's seeded random stream."""
        if self._neighbor_loader is None:
            import warnings

            import torch_geometric.typing as pyg_typing
            from torch_geometric.loader import NeighborLoader

            if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
                raise ImportError("--loader neighbor samples with pyg-lib or torch-sparse, and "
                                  "neither is installed: pip install --no-deps --find-links "
                                  "../shared/wheels torch-scatter==2.1.2 torch-sparse==0.6.18 "
                                  "(prebuilt for torch 2.13.0), or pyg-lib")
            g = self.task.graph
            hops = self.cfg["num_neighbors"] or [10] * self.cfg["layers"]
            with warnings.catch_warnings():
                # torch-sparse's sampler works; PyG only prefers pyg-lib's
                warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation")
                self._neighbor_loader = NeighborLoader(
                    g, num_neighbors=list(hops), input_nodes=g.train_mask,
                    batch_size=self.cfg["batch_size"], shuffle=True, generator=self.loader_gen)
        return self._neighbor_loader

    def dropped_per_epoch(self) -> int:
        """Training graphs a distributed run leaves out of each epoch (a last global batch with
        fewer graphs than processes); 0 for a single process."""
        if self.world is None or self.task.level == "node":
            return 0
        return D.dropped_per_epoch(len(self.task.splits["train"]), self.cfg["batch_size"], self.world)

    def steps_per_epoch(self) -> int:
        if self.task.level == "node":
            if self.cfg["loader"] == "neighbor":
                n = int(self.task.graph.train_mask.sum())
                return math.ceil(n / self.cfg["batch_size"])
            return 1
        n, size = len(self.task.splits["train"]), self.cfg["batch_size"]
        if self.world is not None:
            return D.steps_per_epoch(n, size, self.world)
        return math.ceil(n / size)

    def train_epoch(self, deadline: float | None = None,
                    on_step: Callable[[float], None] | None = None) -> float:
        """One pass over the training set; stops early (mid-epoch) once ``deadline``
        (``time.perf_counter()``) passes — only time-budgeted runs set one. ``on_step(loss)`` is
        called after every optimizer step (the progress bar). Returns the mean task loss; the mean
        of the optimised objective (task + auxiliary + policy-gradient surrogate) is kept in
        ``self.last_objective`` and the task metric on the training batches (as the model was
        when it saw each batch, in training mode) in ``self.last_train_metric``."""
        self.model.train()
        losses, objectives = [], []
        outs, ys = [], []
        batches, _ = self._train_batches()
        for batch, mask, weight in batches:
            batch = batch.to(self.device)
            mask = None if mask is None else mask.to(self.device)
            task_f, objective_f, out = self.train_step(batch, mask, weight)
            losses.append(task_f)
            objectives.append(objective_f)
            y = batch.y
            outs.append((out if mask is None else out[mask]).detach().float().cpu())
            ys.append((y if mask is None else y[mask]).cpu())
            if on_step is not None:
                on_step(task_f)
            if deadline is not None and D.any_rank(time.perf_counter() > deadline, self.world,
                                                   self.device):
                self.budget_hit = True
                break
        self.scheduler.step()
        self.last_objective = float(np.mean(objectives)) if objectives else float("nan")
        outs, ys = _gathered(outs, self.world), _gathered(ys, self.world)
        self.last_train_metric = (task_metric(self.task, torch.cat(outs), torch.cat(ys)) if outs
                                  else float("nan"))
        return float(np.mean(losses)) if losses else float("nan")

    @torch.no_grad()
    def evaluate(self, splits: Sequence[str] = ("val", "test")) -> dict[str, float]:
        """The task metric of the model in evaluation mode on each of ``splits``."""
        self.model.eval()
        task = self.task
        if task.level == "node":
            g = task.graph.to(self.device)
            out = self.model(g)
            res = {s: task_metric(task, out[g[f"{s}_mask"]], g.y[g[f"{s}_mask"]]) for s in splits}
            if "val" in splits:
                res["val_loss"] = float(task_loss(task, out[g.val_mask], g.y[g.val_mask]))
            return res
        res = {}
        for split in splits:
            ds = task.splits[split]
            if self.world is not None:  # each rank its contiguous share, gathered in order
                ds = torch.utils.data.Subset(ds, D.shard(list(range(len(ds))), len(ds), self.world))
            outs, ys = [], []
            for batch in DataLoader(ds, batch_size=max(self.cfg["batch_size"], 64)):
                batch = batch.to(self.device)
                outs.append(self.model(batch).float().cpu())
                ys.append(batch.y.cpu())
            outs, ys = _gathered(outs, self.world), _gathered(ys, self.world)
            res[split] = task_metric(task, torch.cat(outs), torch.cat(ys))
            if split == "val":
                res["val_loss"] = float(task_loss(task, torch.cat(outs), torch.cat(ys)))
        return res

    def _in_warm_start(self) -> bool:
        """Whether a producer of the model is still in its warm start
        (:meth:`~graphattn.core.contract.EdgeProducer.in_warm_start`): its evaluations are recorded
        (``warm_start`` in the history row) but never selected, and patience starts after it."""
        from graphattn.core.contract import EdgeProducer

        return any(m.in_warm_start() for m in self.model.modules() if isinstance(m, EdgeProducer))

    def _better(self, val: float, val_loss: float) -> bool:
        """Whether this evaluation is the new selected epoch: ``select="metric"`` the best
        validation metric (the first epoch reaching it), ``"loss"`` the lowest validation task
        loss (the early-stopping rule of GCN and GRAND)."""
        if self.best is None:
            return True
        if self.cfg["select"] == "loss":
            return val_loss < self.best.get("val_loss", math.inf)
        return val > self.best["val"] if self.higher_is_better else val < self.best["val"]

    def fit(self, announce: bool = True) -> dict[str, Any]:
        """Trains up to ``epochs`` (or the time budget / patience), evaluating the validation metric
        every ``eval_every`` epochs; the test metric is computed only for a new best validation
        epoch (model selection on validation alone). With ``announce``, a run whose estimated time
        is far beyond its budget (or beyond half an hour) says so early in its first epoch."""
        cfg = self.cfg
        budget = cfg["time_budget"] * 60 if cfg["time_budget"] else None
        stopped = None
        steps = self.steps_per_epoch()
        announce = announce and self.is_main
        bar = tqdm(total=cfg["epochs"] * steps, initial=self.epoch * steps,
                   disable=not (cfg["progress"] and self.is_main),
                   desc=f"{self.task.name} seed {self.seed}", unit="step", leave=False,
                   dynamic_ncols=True,
                   # a log file (not a terminal) gets a line every half minute, not every step
                   mininterval=0.1 if sys.stderr.isatty() else 30.0)
        metric = self.task.metric
        post: dict[str, str] = {}
        # the estimate: the first (slower) step plus the mean of the next ones, taken at the end of
        # the first epoch or after 1 + ESTIMATE_STEPS steps, whichever comes first
        clock = {"n": 0, "first": 0.0, "sum": 0.0, "last": 0.0}

        def on_step(loss: float) -> None:
            bar.update(1)
            now = time.perf_counter()
            if announce and clock["n"] <= ESTIMATE_STEPS:
                if clock["n"] == 0:
                    clock["first"] = now - t0
                else:
                    clock["sum"] += now - clock["last"]
                clock["last"] = now
                clock["n"] += 1
                n = int(clock["n"])
                if n == min(steps, ESTIMATE_STEPS + 1):
                    step_s = clock["sum"] / (n - 1) if n > 1 else clock["first"]
                    self._announce(clock["first"] + step_s * (steps - 1), budget)
            post["loss"] = f"{loss:.4f}"
            bar.set_postfix(post, refresh=False)

        while self.epoch < cfg["epochs"]:
            if budget is not None and self.elapsed >= budget:
                stopped = f"time budget of {cfg['time_budget']} min reached"
                break
            if (cfg["patience"] and self.best is not None
                    and self.epoch - self.best["epoch"] >= cfg["patience"]):
                stopped = f"no validation improvement for {cfg['patience']} epochs"
                break
            t0 = time.perf_counter()
            deadline = None if budget is None else t0 + (budget - self.elapsed)
            loss = self.train_epoch(deadline, on_step)
            self.epoch += 1
            row: dict[str, Any] = {"epoch": self.epoch, "loss": loss,
                                   f"train_{metric}": self.last_train_metric}
            if self.last_objective != loss:  # aux / policy-gradient terms were optimised too
                row["objective"] = self.last_objective
            if (self.epoch % cfg["eval_every"] == 0 or self.epoch == cfg["epochs"]
                    or self.budget_hit):
                # one forward pass gives every split of a node task; graph tasks evaluate the
                # test split only for a new best validation epoch
                warming = self._in_warm_start()  # before evaluate: it asks for the edges
                res = self.evaluate(("val", "test") if self.task.level == "node" else ("val",))
                row["val"], row["val_loss"] = res["val"], res["val_loss"]
                if warming:  # the producers' warm-start edges, not their own: never selected
                    row["warm_start"] = True
                elif self._better(row["val"], row["val_loss"]):
                    row["test"] = res["test"] if "test" in res else self.evaluate(("test",))["test"]
                    self.best = {"epoch": self.epoch, "val": row["val"], "test": row["test"],
                                 "val_loss": row["val_loss"]}
                    self.save("best.pt")
            # the slowest rank's clock, so that every rank takes the same time-budget decision
            self.elapsed = D.max_over_ranks(self.elapsed + time.perf_counter() - t0, self.world,
                                            self.device)
            row["time_s"] = self.elapsed
            self.history.append(row)
            self.save("last.pt")
            post.update({"epoch": f"{self.epoch}/{cfg['epochs']}",
                         f"train {metric}": f"{self.last_train_metric:.4f}"})
            if "val" in row:
                post[f"val {metric}"] = f"{row['val']:.4f}"
            if self.best is not None:
                post["best val"] = f"{self.best['val']:.4f}@{self.best['epoch']}"
            bar.set_postfix(post)
            if self.budget_hit:
                stopped = f"time budget of {cfg['time_budget']} min reached (mid-epoch {self.epoch})"
                break
        bar.close()
        warm_evaluations = sum(1 for r in self.history if r.get("warm_start"))
        if self.best is None and warm_evaluations:
            raise RuntimeError(
                f"every evaluation ({warm_evaluations}) fell in a producer's warm start, "
                "whose edges are not the producer's own, so no epoch could be selected: raise "
                "'epochs' above the warm start (or lower 'warm_start')")
        if self.best is None:
            raise RuntimeError("no evaluation happened (the run has no epoch left to train; "
                               "raise --epochs or start a new --out)")
        return {
            "task": self.task.name, "seed": self.seed, "metric": self.task.metric,
            "best_epoch": self.best["epoch"], "val": self.best["val"], "test": self.best["test"],
            "epochs_run": self.epoch, "train_time_s": round(self.elapsed, 2),
            "params": self.n_params, "stopped": stopped,
            "edge_stats": _density(self.model),
            "processes": self.world.size if self.world is not None else 1,
        }

    def _announce(self, epoch_s: float, budget: float | None) -> None:
        """Warns when the run's estimated training time is far beyond its budget (or, without a
        budget, beyond half an hour), from the first step's time."""
        remaining = self.cfg["epochs"] - self.epoch
        estimate = epoch_s * remaining
        if budget is not None:
            if estimate <= 2 * budget:
                return
            fits = max(int(budget // max(epoch_s, 1e-9)), 0)
            msg = (f"at ~{_duration(epoch_s)} per epoch, {remaining} epochs would take "
                   f"~{_duration(estimate)}; the time budget of {_duration(budget)} stops training "
                   f"after ~{fits} epoch(s)")
        elif estimate > LONG_RUN_S:
            msg = (f"at ~{_duration(epoch_s)} per epoch, {remaining} epochs will take "
                   f"~{_duration(estimate)} (lower --epochs, choose a lighter producer, or set "
                   f"--time-budget)")
        else:
            return
        tqdm.write(f"graphattn run: note: {self.task.name} seed {self.seed}: {msg}", file=sys.stderr)


#: steps timed (after the first) for the estimate of a run's length
ESTIMATE_STEPS = 10
#: a run estimated to train longer than this (seconds) without a time budget says so
LONG_RUN_S = 30 * 60


def _seed_mask(batch: Any) -> Tensor:
    """The seed nodes of a :class:`~torch_geometric.loader.NeighborLoader` batch (its first
    ``batch_size`` nodes): the nodes the loss is taken on."""
    return torch.arange(batch.num_nodes, device=batch.y.device) < batch.batch_size


def _gathered(tensors: list[Tensor], world: D.World | None) -> list[Tensor]:
    """Every rank's list of CPU tensors, concatenated in rank order (a single process: as is)."""
    if world is None:
        return tensors
    return [t for part in D.gather_objects(tensors, world) for t in part]


def _duration(seconds: float) -> str:
    seconds = max(float(seconds), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    return f"{int(minutes // 60)} h {int(minutes % 60)} min"


def _density(model: GraphModel) -> list[dict[str, float] | None]:
    """Scalar edge-set statistics of each layer's last forward pass (None: no global branch)."""
    out: list[dict[str, float] | None] = []
    for layer in model.layers:
        es = layer.last_edges
        if es is None:
            out.append(None)
            continue
        stats = {}
        for k, v in es.stats.items():
            # scalars only: a [1, 1] per-(graph, head) tensor of a one-graph batch is not a scalar
            if isinstance(v, (int, float)) or (isinstance(v, Tensor) and v.dim() == 0):
                stats[k] = round(float(v), 4)
        out.append(stats)
    return out


def _param_groups(model: nn.Module, cfg: dict[str, Any]) -> Any:
    """The optimizer's parameters: all in one group, or with ``pg_lr`` the producers' policy
    parameters (:meth:`~graphattn.producers.EdgeProducer.policy_parameters`) in a group of that
    learning rate (a ``ValueError`` when the model has none: the option would do nothing)."""
    if cfg["pg_lr"] is None:
        return model.parameters()
    policy: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, EdgeProducer):
            policy.update((id(p), p) for p in module.policy_parameters())
    if not policy:
        raise ValueError("'pg_lr' sets the learning rate of the parameters only the policy gradient "
                         "trains (SAC's edge predictor), but this model has none")
    rest = [p for p in model.parameters() if id(p) not in policy]
    return [{"params": rest}, {"params": list(policy.values()), "lr": cfg["pg_lr"]}]

