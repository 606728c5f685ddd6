"""Restoring trained models from run directories and checkpoints."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphattn.runner.config import resolve_config
from graphattn.runner.tasks import Task


def find_checkpoint(path: str | Path, seed: int | None = None) -> Path:
    """``path`` itself if it is a file, else ``<run>/seed<k>/best.pt`` (first seed by default)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"{path} is neither a run directory nor a checkpoint file")
    if seed is None:
        seeds = sorted(int(p.name[4:]) for p in path.glob("seed*") if p.name[4:].isdigit())
        if not seeds:
            raise ValueError(f"{path} holds no seed<k>/ checkpoint folder")
        seed = seeds[0]
    ck = path / f"seed{seed}" / "best.pt"
    if not ck.exists():
        raise ValueError(f"no checkpoint {ck}")
    return ck


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint written by the runner, loaded with ``torch.load(weights_only=True)``: tensors
    and plain containers only, so a file from someone else cannot run code when it is opened.
    A damaged, truncated or foreign file raises a ``ValueError`` naming it."""
    path = Path(path)
    try:
        with warnings.catch_warnings():  # garbage can look like an unusual pickle protocol
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ck = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path} does not exist") from None
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"checkpoint {path} holds more than tensors and plain containers, or is "
                         f"damaged; graphattn checkpoints never need code to load, so it is not "
                         f"loaded ({first})") from None
    except (RuntimeError, EOFError, OSError, ValueError, IndexError, KeyError, TypeError,
            AttributeError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
        # random bytes reach the unpickler in any state: every error it can raise is "damaged"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"checkpoint {path} cannot be read: it is damaged or truncated ({first}); "
                         f"delete it and train again (or resume from another checkpoint)") from None
    if not isinstance(ck, dict) or "model" not in ck or "config" not in ck:
        raise ValueError(f"checkpoint {path} is not a graphattn run checkpoint (no model/config)")
    return ck


def restore(path: str | Path, seed: int | None = None, device: str = "cpu",
            data_root: str | None = None) -> tuple[nn.Module, Task]:
    """The trained model (in eval mode) and its task, from a run directory or a checkpoint."""
    from graphattn.runner.build import build_configured_task, build_model, prepare_task

    ck_path = find_checkpoint(path, seed)
    ck = load_checkpoint(ck_path, map_location=device)
    cfg = resolve_config({k: v for k, v in ck["config"].items()})
    if data_root is not None:
        cfg["data_root"] = data_root
    task = prepare_task(build_configured_task(cfg), cfg)
    model = build_model(cfg, task).to(device)
    model.eval()
    first = task.graph if task.level == "node" else task.splits["train"][0]
    from torch_geometric.data import Batch

    with torch.no_grad():  # materialises lazy parameters, on the model's device
        model((first if task.level == "node" else Batch.from_data_list([first])).to(device))
    model.load_state_dict(ck["model"])
    model.eval()
    return model, task


def read_config(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "config.json").read_text())
