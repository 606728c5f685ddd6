"""Data-parallel training under ``torchrun``: the process group, each rank's share of a global
batch, and the collectives the runner needs (loss logs, predictions for whole-split metrics,
per-rank state for checkpoints).

``torchrun --nproc-per-node N -m graphattn run ...`` starts ``N`` processes with ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` set; :func:`setup` joins them into one process group (``gloo``
on the CPU, ``nccl`` on CUDA). A world of one process is plain single-process training.

**One global batch, split across ranks.** Every rank draws the same epoch order from the same
seeded generator (as the single-process loader does), cuts it into global batches of
``batch_size`` graphs and keeps its contiguous share ``B_r`` (:func:`torch.tensor_split`, sizes
differing by at most one). The gradient DDP averages over ranks, with every rank's loss scaled by
``w_r = W |B_r| / |B|``, is

    (1/W) Σ_r w_r ∇L(B_r) = Σ_r (|B_r| / |B|) ∇L(B_r) = ∇L(B),

the gradient of the mean loss over the whole global batch: ``N`` processes with batch size ``B``
train the model that one process with batch size ``B`` trains, up to float rounding and to random
draws (dropout, sampled edges) that each rank makes from its own seeded stream. A final global
batch smaller than ``W`` would leave a rank without a graph; it is dropped, and the run says so.
"""

from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import BatchSampler, RandomSampler, Sampler


@dataclass(frozen=True)
class World:
    """This process's place in the process group."""

    rank: int
    local_rank: int
    size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env() -> World | None:
    """The :class:`World` that ``torchrun`` describes in the environment (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``), or ``None`` for a single process (no such variables, or a world of one)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    try:
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        raise RuntimeError(f"WORLD_SIZE={size} is set but RANK is not a valid int: start "
                           f"distributed runs with torchrun") from None
    return World(rank=rank, local_rank=local, size=size)


def setup(device: str, timeout_s: float = 1800.0) -> tuple[World | None, str]:
    """Joins the process group ``torchrun`` set up, if any: ``(world, device)`` where ``device``
    is the config's device with a CUDA device replaced by this rank's ``cuda:<LOCAL_RANK>``.
    The backend is ``nccl`` for CUDA and ``gloo`` for the CPU."""
    world = world_from_env()
    if world is None:
        return None, device
    if device.startswith("cuda"):
        device = f"cuda:{world.local_rank}"
        torch.cuda.set_device(world.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    if dist.get_world_size() != world.size or dist.get_rank() != world.rank:
        raise RuntimeError(f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) "
                           f"does not match the environment (RANK={world.rank}, "
                           f"WORLD_SIZE={world.size})")
    return world, device


def teardown(world: World | None, *, synchronize: bool = True) -> None:
    """Leaves the process group :func:`setup` joined.

    With ``synchronize`` (a run that ended normally) it first collects the garbage, so that
    objects still holding the group through reference cycles (a finished trainer's DDP wrapper and
    its reducer) are freed while the group is alive rather than at interpreter exit, where gloo's
    worker threads can abort the process; then it waits for every rank (rank 0 writes the results
    after the others are done), and only then destroys the group. After an error it destroys the
    group without the barrier, which could wait forever for a rank that has died."""
    if world is None or not dist.is_initialized():
        return
    if synchronize:
        gc.collect()
        dist.barrier()
    dist.destroy_process_group()


def barrier(world: World | None) -> None:
    if world is not None:
        dist.barrier()


class RankShardSampler(Sampler[list[int]]):
    """Batch sampler: the global batches of ``BatchSampler(RandomSampler(data, generator),
    batch_size)`` — the single-process loader's batches, drawn from the same generator — with only
    ``rank``'s contiguous share of each kept. A final global batch with fewer than ``world_size``
    graphs is dropped (counted in :attr:`dropped`)."""

    def __init__(self, data: Sized, batch_size: int, generator: torch.Generator,
                 world: World) -> None:
        self.batches = BatchSampler(RandomSampler(data, generator=generator), batch_size,
                                    drop_last=False)
        self.batch_size, self.world, self.n = batch_size, world, len(data)
        self.dropped = dropped_per_epoch(self.n, batch_size, world)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            if len(batch) < self.world.size:
                continue
            yield shard(batch, len(batch), self.world)

    def __len__(self) -> int:
        return steps_per_epoch(self.n, self.batch_size, self.world)


def steps_per_epoch(n: int, batch_size: int, world: World) -> int:
    """Global batches per epoch of ``n`` graphs: the full ones, and a last one if it has at least
    one graph per process."""
    return n // batch_size + (1 if n % batch_size >= world.size else 0)


def dropped_per_epoch(n: int, batch_size: int, world: World) -> int:
    """Graphs left out of each epoch: a last global batch with fewer graphs than processes."""
    rest = n % batch_size
    return rest if rest < world.size else 0


def shard(items: list[int], n: int, world: World) -> list[int]:
    """``world.rank``'s contiguous share of ``items`` (``n`` of them): sizes differ by at most one,
    lower ranks take the larger shares (as :func:`torch.tensor_split`)."""
    base, extra = divmod(n, world.size)
    start = world.rank * base + min(world.rank, extra)
    return items[start:start + base + (1 if world.rank < extra else 0)]


def loss_weight(n_local: int, n_global: int, world: World) -> float:
    """``W |B_r| / |B|``: the factor that makes DDP's average of the ranks' gradients the
    gradient of the global batch's mean loss."""
    return world.size * n_local / n_global


def mean_over_ranks(values: Tensor, world: World | None) -> Tensor:
    """The mean over ranks of ``values`` (every rank gets it)."""
    if world is None:
        return values
    out = values.clone()
    dist.all_reduce(out)
    return out / world.size


def any_rank(flag: bool, world: World | None, device: torch.device) -> bool:
    """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
    if world is None:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def max_over_ranks(value: float, world: World | None, device: torch.device) -> float:
    if world is None:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def gather_objects(obj: Any, world: World | None) -> list[Any]:
    """Every rank's ``obj`` in rank order (``[obj]`` for a single process); tensors should be on
    the CPU."""
    if world is None:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def cat_over_ranks(tensor: Tensor, world: World | None) -> Tensor:
    """The ranks' ``tensor`` (CPU) concatenated along dimension 0 in rank order — rank ``r``'s
    contiguous share of a split back in the split's order."""
    if world is None:
        return tensor
    return torch.cat(gather_objects(tensor, world))
