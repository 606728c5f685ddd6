"""LRA ListOps, generated here from the published task definition, with an exact evaluator.

A ListOps expression is a tree of list operators over single digits (Long Range Arena; Nangia &
Bowman 2018):

* ``[MAX a b ...]`` maximum, ``[MIN ...]`` minimum, ``[MED ...]`` median (``int(numpy.median)``,
  i.e. the mean of the two middle values rounded towards zero for an even count), ``[SM ...]`` sum
  modulo 10; each operator takes 2 to ``max_args`` (10) arguments;
* trees are at most ``max_depth`` (10) deep; the label is the value of the root (10 classes);
* the serialisation is LRA's: the tree is binarised left to right and every internal pair wrapped in
  parentheses, e.g. ``[MAX 2 9 ]`` becomes ``( ( ( [MAX 2 ) 9 ) ] )``; parentheses carry no
  meaning for the value;
* sequences are drawn until their length lies in ``[min_length, max_length]`` (500–2000 tokens in
  LRA; LRA sizes are 96k / 2k / 2k).

Generation draws every node as a digit with probability ``1 - branch_p`` (always at the maximum
depth) or as an operator with a uniform number of arguments in ``[2, max_args]``; ``branch_p = 0.25``
as in LRA. Everything is seeded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch_geometric.data import Data, Dataset

from graphattn.data.base import CachedDataset
from graphattn.data.store import atomic_torch_save, data_root

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
PAREN_OPEN, PAREN_CLOSE = "(", ")"
DIGITS = tuple(str(d) for d in range(10))
PAD, CLS = "<pad>", "<cls>"
VOCAB: tuple[str, ...] = (PAD, CLS, *DIGITS, *OPERATORS, CLOSE, PAREN_OPEN, PAREN_CLOSE)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}

Tree = int | tuple[str, list["Tree"]]


def apply_operator(op: str, args: Sequence[int]) -> int:
    if not args:
        raise ValueError(f"operator {op} needs at least one argument")
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(np.median(np.asarray(args)))
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown operator {op!r}")


def evaluate_tree(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    return apply_operator(op, [evaluate_tree(a) for a in args])


def evaluate_tokens(tokens: Sequence[str]) -> int:
    """Value of a serialised expression (parentheses, padding and CLS ignored); raises
    :class:`ValueError` on a malformed one."""
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in tokens:
        if tok in (PAREN_OPEN, PAREN_CLOSE, PAD, CLS):
            continue
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == CLOSE:
            if not stack:
                raise ValueError("']' without an open operator")
            op, args = stack.pop()
            value = apply_operator(op, args)
            if stack:
                stack[-1][1].append(value)
            elif result is None:
                result = value
            else:
                raise ValueError("more than one top-level expression")
        elif tok in DIGITS:
            if stack:
                stack[-1][1].append(int(tok))
            elif result is None:
                result = int(tok)
            else:
                raise ValueError("more than one top-level expression")
        else:
            raise ValueError(f"unknown token {tok!r}")
    if stack or result is None:
        raise ValueError("unbalanced or empty expression")
    return result


def serialise(tree: Tree) -> list[str]:
    """LRA serialisation: binarise ``(op, [a1, ..., an])`` as ``((((op a1) a2) ... an) ])`` and
    wrap every pair in parentheses."""
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    out = [op, *serialise(args[0])]
    out = [PAREN_OPEN, *out, PAREN_CLOSE]
    for a in args[1:]:
        out = [PAREN_OPEN, *out, *serialise(a), PAREN_CLOSE]
    return [PAREN_OPEN, *out, CLOSE, PAREN_CLOSE]


def generate_tree(rng: random.Random, depth: int = 1, *, max_depth: int = 10, max_args: int = 10,
                  branch_p: float = 0.25) -> Tree:
    if depth >= max_depth or rng.random() >= branch_p:
        return rng.randrange(10)
    op = rng.choice(OPERATORS)
    n = rng.randint(2, max_args)
    return op, [generate_tree(rng, depth + 1, max_depth=max_depth, max_args=max_args,
                              branch_p=branch_p) for _ in range(n)]


def generate_example(rng: random.Random, *, min_length: int = 500, max_length: int = 2000,
                     max_depth: int = 10, max_args: int = 10, branch_p: float = 0.25,
                     max_tries: int = 100_000) -> tuple[list[str], int]:
    """One ``(tokens, label)`` whose root is an operator and whose length lies in the range."""
    for _ in range(max_tries):
        op = rng.choice(OPERATORS)
        n = rng.randint(2, max_args)
        tree = (op, [generate_tree(rng, 2, max_depth=max_depth, max_args=max_args,
                                   branch_p=branch_p) for _ in range(n)])
        tokens = serialise(tree)
        if min_length <= len(tokens) <= max_length:
            return tokens, evaluate_tree(tree)
    raise RuntimeError(f"no ListOps expression of length [{min_length}, {max_length}] in "
                       f"{max_tries} tries; widen the range or raise branch_p")


class ListOps(CachedDataset, Dataset):
    """A generated ListOps split as a PyG dataset of token sequences (``data.tokens`` ``[L]`` with
    ids into :data:`VOCAB`, ``data.y`` the value). Pass ``transform=SequenceToGraph(...)`` to get
    graphs. Generated once per configuration and cached in the data root.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (different seeds).
        num_samples: sizes per split (LRA: 96000 / 2000 / 2000).
        min_length, max_length, max_depth, max_args, branch_p: the task definition (see module).
        seed: base seed.
    """

    DEFAULT_SIZES: ClassVar[dict[str, int]] = {"train": 96_000, "val": 2_000, "test": 2_000}
    rebuilt_from = "its configuration (generated again)"

    def __init__(self, root: str | os.PathLike | None = None, split: str = "train", *,
                 num_samples: int | None = None, min_length: int = 500, max_length: int = 2000,
                 max_depth: int = 10, max_args: int = 10, branch_p: float = 0.25, seed: int = 0,
                 transform: Callable | None = None) -> None:
        if split not in self.DEFAULT_SIZES:
            raise ValueError(f"'split' must be one of {sorted(self.DEFAULT_SIZES)}, got {split!r}")
        if not 1 <= min_length <= max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        self.config: dict[str, Any] = {
            "split": split,
            "num_samples": num_samples if num_samples is not None else self.DEFAULT_SIZES[split],
            "min_length": min_length, "max_length": max_length, "max_depth": max_depth,
            "max_args": max_args, "branch_p": branch_p, "seed": seed,
        }
        key = hashlib.sha1(json.dumps(self.config, sort_keys=True).encode()).hexdigest()[:12]
        self._file = f"listops-{split}-{key}.pt"
        super().__init__(str(data_root(root) / "ListOps"), transform)
        n = self.config["num_samples"]

        def valid(obj: Any) -> bool:
            if not (isinstance(obj, tuple) and len(obj) == 3
                    and all(isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 1
                            for t in obj)):
                return False
            tokens, offsets, labels = obj
            return (labels.numel() == n and offsets.numel() == n + 1 and int(offsets[0]) == 0
                    and int(offsets[-1]) == tokens.numel() and bool((offsets.diff() >= 0).all()))

        self.tokens, self.offsets, self.labels = self.load_processed(
            self.processed_paths[0], valid, f"the (tokens, offsets, labels) of {n} sequences")

    @property
    def raw_file_names(self) -> list[str]:
        return []

    @property
    def processed_file_names(self) -> list[str]:
        return [self._file]

    def download(self) -> None:
        pass

    def process(self) -> None:
        c = self.config
        split_salt = {"train": 0, "val": 1, "test": 2}[c["split"]]
        rng = random.Random(c["seed"] * 1000 + split_salt)
        seqs, labels = [], []
        for _ in range(c["num_samples"]):
            toks, label = generate_example(rng, min_length=c["min_length"], max_length=c["max_length"],
                                           max_depth=c["max_depth"], max_args=c["max_args"],
                                           branch_p=c["branch_p"])
            seqs.append(torch.tensor([TOKEN_ID[t] for t in toks], dtype=torch.long))
            labels.append(label)
        lengths = torch.tensor([s.numel() for s in seqs], dtype=torch.long)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        flat = torch.cat(seqs) if seqs else torch.empty(0, dtype=torch.long)
        atomic_torch_save((flat, offsets, torch.tensor(labels, dtype=torch.long)), self.processed_paths[0])

    def len(self) -> int:
        return int(self.labels.numel())

    def get(self, idx: int) -> Data:
        s, e = int(self.offsets[idx]), int(self.offsets[idx + 1])
        return Data(tokens=self.tokens[s:e].clone(), y=self.labels[idx : idx + 1], num_nodes=e - s)

    def token_strings(self, idx: int) -> list[str]:
        s, e = int(self.offsets[idx]), int(self.offsets[idx + 1])
        return [VOCAB[i] for i in self.tokens[s:e].tolist()]
