"""ListOps: the generator against the independent evaluator, the format, the sizes, the seeds."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.data.listops import (
    VOCAB,
    ListOps,
    apply_operator,
    evaluate_tokens,
    evaluate_tree,
    generate_example,
    generate_tree,
    serialise,
)


def test_operator_semantics():
    assert apply_operator("[MIN", [4, 2, 9]) == 2
    assert apply_operator("[MAX", [4, 2, 9]) == 9
    assert apply_operator("[MED", [4, 2, 9]) == 4
    assert apply_operator("[MED", [1, 2, 3, 6]) == 2  # int(median 2.5): towards zero
    assert apply_operator("[SM", [7, 8, 9]) == 4  # 24 mod 10


def test_lra_serialisation_and_evaluation():
    tree = ("[MAX", [2, ("[MIN", [5, 3]), 9])
    toks = serialise(tree)
    assert " ".join(toks) == "( ( ( ( [MAX 2 ) ( ( ( [MIN 5 ) 3 ) ] ) ) 9 ) ] )"
    assert evaluate_tokens(toks) == evaluate_tree(tree) == 9
    with pytest.raises(ValueError):
        evaluate_tokens(["[MAX", "1"])
    with pytest.raises(ValueError):
        evaluate_tokens(["]"])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), max_depth=st.integers(1, 10), max_args=st.integers(2, 10))
def test_generator_agrees_with_evaluator(seed, max_depth, max_args):
    rng = random.Random(seed)
    tree = generate_tree(rng, max_depth=max_depth, max_args=max_args, branch_p=0.5)
    toks = serialise(tree)
    assert evaluate_tokens(toks) == evaluate_tree(tree)

    def depth(t):
        return 0 if isinstance(t, int) else 1 + max(depth(a) for a in t[1])

    def args_ok(t):
        return isinstance(t, int) or (2 <= len(t[1]) <= max_args and all(args_ok(a) for a in t[1]))

    assert depth(tree) <= max_depth and args_ok(tree)


def test_examples_respect_length_and_are_seeded():
    rng = random.Random(3)
    lengths, labels = [], []
    for _ in range(40):
        toks, y = generate_example(rng, min_length=500, max_length=2000)
        assert 500 <= len(toks) <= 2000 and toks[0] == "(" and toks[-1] == ")"
        assert evaluate_tokens(toks) == y
        lengths.append(len(toks))
        labels.append(y)
    again = [generate_example(random.Random(3))[1] for _ in range(1)]
    assert again[0] == labels[0]
    assert len(set(labels)) > 3  # not degenerate


def test_dataset_cache_and_splits(tmp_path):
    kw = dict(num_samples=25, min_length=20, max_length=80, seed=1)
    train = ListOps(tmp_path, "train", **kw)
    assert len(train) == 25
    d = train[0]
    toks = [VOCAB[i] for i in d.tokens.tolist()]
    assert evaluate_tokens(toks) == int(d.y)
    assert 20 <= d.tokens.numel() <= 80
    again = ListOps(tmp_path, "train", **kw)  # cached
    assert torch.equal(again.tokens, train.tokens)
    val = ListOps(tmp_path, "val", **kw)
    assert not torch.equal(val.tokens[:50], train.tokens[:50])
    with pytest.raises(ValueError, match="split"):
        ListOps(tmp_path, "dev")
    labels = np.array([int(train[i].y) for i in range(len(train))])
    assert labels.min() >= 0 and labels.max() <= 9
