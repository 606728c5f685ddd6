"""The memory guard (graphattn.memory): every producer and the explicit path refuse, before
allocating, an edge set above the memory budget, quickly and with a message that names the edge
count, the bytes, the budget and what to lower; the budget is configurable; ordinary sizes pass and
the guard adds no host synchronisation.

The eleven cases of issue 19 run under an explicit budget, so the outcome does not depend on the
machine's free memory. Each would need terabytes (or more) if the guard let it through."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from torch_geometric.data import Data

import graphattn as ga
from graphattn import EdgeAttention, MemoryBudgetError, SharedSourceEdgeSet, union_edge_sets
from graphattn.core.syncs import count_host_syncs
from graphattn.memory import (
    EDGE_BYTES,
    ENV_VAR,
    available_memory,
    check_edges,
    get_memory_budget,
    memory_budget,
    set_memory_budget,
    within_budget,
)
from graphattn.producers import (
    ExpanderEdges,
    FullAttention,
    GlobalTokens,
    KNNEdges,
    RandomEdges,
    SlidingWindow,
    UnionProducer,
)
from graphattn.producers.converter import ConverterProducer
from graphattn.producers.sac import SAC
from graphattn.producers.samsa import SAMSA
from graphattn.producers.sbm import SBMEdges
from tests.helpers import make_batch

#: the budget the refusal cases run under (each case needs far more)
BUDGET = "8GiB"
#: the issue's target is 2 s per refusal; asserted generously (shared CI machines)
LIMIT_S = 10.0


@pytest.fixture(autouse=True)
def _default_budget(monkeypatch):
    """Every test starts from the default budget, whatever the environment says."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    set_memory_budget(None)
    yield
    set_memory_budget(None)


def _zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, 1)


# ------------------------------------------------------------------- the eleven cases of issue 19
def full_attention():
    EdgeAttention(1, 8)(_zeros(2_000_000), FullAttention())


def full_attention_reference_kernel():
    EdgeAttention(1, 8, kernel="reference")(_zeros(2_000_000), FullAttention())


def knn_k_100000():
    n = 200_000
    KNNEdges(k=100_000)(_zeros(n), data=Data(pos=torch.randn(n, 2), num_nodes=n))


def expander_degree_1e6():
    ExpanderEdges(degree=10**6)(_zeros(200_000))


def sbm_delta_0():
    layer = EdgeAttention(4, 8, heads=2).eval()
    layer(torch.randn(200_000, 4), SBMEdges(num_clusters=4, delta=0.0))


def random_k_1e12():
    RandomEdges(k=10**12)(_zeros(1000))


def window_1e10():
    SlidingWindow(window=10**10)(_zeros(200_000))


def global_tokens_100000():
    GlobalTokens(positions=tuple(range(100_000)))(_zeros(200_000))


def sac_alpha_1e7():
    SAC(alpha=1e7, channels=4)(torch.randn(10_000, 4))


def samsa_max_pairs():
    layer = EdgeAttention(4, 4).train()
    layer(torch.randn(20_000, 4), SAMSA(channels=4, k=20_000).train())


def converter_trace():
    layer = EdgeAttention(4, 4, mode="weighted").eval()
    with ga.trace(layer):
        layer(torch.randn(10_000, 4), ConverterProducer(channels=4))


CASES = {
    "full": (full_attention, r"full attention on 2,000,000 nodes .* 4,000,000,000,000 edges"),
    "full_reference": (full_attention_reference_kernel, r"4,000,000,000,000 edges"),
    "knn": (knn_k_100000, r"KNNEdges\(k=100,000\) .* 20,000,000,000 edges .* lower k"),
    "expander": (expander_degree_1e6, r"ExpanderEdges\(degree=1,000,000\) .* lower degree"),
    "sbm": (sbm_delta_0, r"SBMEdges \(delta=0, 2 heads\) on 200,000 nodes"),
    "random": (random_k_1e12, r"RandomEdges\(k=1,000,000,000,000\) .* 1.00e\+15 edges .* lower k"),
    "window": (window_1e10, r"SlidingWindow\(window=10,000,000,000\) .* lower window"),
    "global": (global_tokens_100000, r"GlobalTokens with 100,000 positions .* 40,000,000,000 edges"),
    "sac": (sac_alpha_1e7, r"SAC\(alpha=1e\+07\) on 10,000 nodes .* lower alpha"),
    "samsa": (samsa_max_pairs, r"max_pairs"),
    "converter_trace": (converter_trace, r"max_nodes_per_graph"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_of_the_issue_is_refused_quickly_and_clearly(name):
    case, pattern = CASES[name]
    with memory_budget(BUDGET):
        start = time.perf_counter()
        with pytest.raises(ValueError, match=pattern) as info:
            case()
        elapsed = time.perf_counter() - start
    assert elapsed < LIMIT_S, f"{name}: refused after {elapsed:.2f} s"
    if isinstance(info.value, MemoryBudgetError):
        msg = str(info.value)
        assert "memory budget of 8.0 GiB (set with graphattn.set_memory_budget)" in msg
        assert "TiB" in msg or "PiB" in msg  # the bytes
        assert "set_memory_budget" in msg and ENV_VAR in msg  # how to raise it


def test_the_guard_covers_nine_of_the_eleven_cases():
    """SAMSA (max_pairs) and the Converter trace (max_nodes_per_graph) refused before the guard."""
    own = []
    with memory_budget(BUDGET):
        for name, (case, _) in CASES.items():
            try:
                case()
            except MemoryBudgetError:
                own.append(name)
            except ValueError:
                pass
    assert sorted(own) == sorted(set(CASES) - {"samsa", "converter_trace"})


# ------------------------------------------------------------------------- moderate-size refusals
def test_to_explicit_of_a_structured_edge_set_is_guarded():
    n = 20_000  # 4e8 edges if enumerated; the sources themselves are tiny
    es = SharedSourceEdgeSet(torch.arange(n).view(1, 1, n), torch.tensor([0, n]))
    with memory_budget("1GiB"), pytest.raises(MemoryBudgetError, match=r"to_explicit\(\)"):
        es.to_explicit()


def test_the_reference_path_counts_its_messages():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 4, generator=g)
    edge_index = torch.randint(0, 1000, (2, 20_000), generator=g)
    layer = EdgeAttention(4, 8, heads=2, kernel="reference")
    # the edges themselves (20k × 64 B ≈ 1.2 MiB) fit, their 2 × 8-channel messages do not
    with memory_budget("2MiB"), pytest.raises(MemoryBudgetError, match="reference path"):
        layer(x, edge_index)
    with memory_budget("64MiB"):
        assert torch.isfinite(layer(x, edge_index)).all()


def test_union_is_guarded():
    b = make_batch([30, 40])
    parts = [RandomEdges(k=8)(b.x, b.batch), SlidingWindow(window=4)(b.x, b.batch)]
    total = sum(p.num_edges for p in parts)
    with memory_budget(total * EDGE_BYTES - 1), pytest.raises(MemoryBudgetError, match="union of 2"):
        union_edge_sets(parts, b.num_nodes)
    with memory_budget(total * EDGE_BYTES):
        assert union_edge_sets(parts, b.num_nodes).num_edges == total


def test_sbm_checks_the_expected_count_when_the_size_bound_does_not_fit():
    """The free bound (1 + δ) H N² overestimates the draws about four-fold at initialisation
    (p ≈ 0.25): between the two the exact expectation decides, and lets the draw through."""
    from graphattn.producers.sbm import SBM_EDGE_BYTES

    torch.manual_seed(0)
    N, H = 64, 2
    layer = EdgeAttention(4, 8, heads=H).eval()
    x = torch.randn(N, 4)
    bound = H * N * N * SBM_EDGE_BYTES
    with memory_budget(bound // 2):
        layer(x, SBMEdges(num_clusters=4, delta=0.0))
    with memory_budget(bound // 50), pytest.raises(MemoryBudgetError, match="SBMEdges"):
        layer(x, SBMEdges(num_clusters=4, delta=0.0))


def test_a_window_wider_than_the_graphs_is_narrowed_not_refused():
    b = make_batch([5, 17, 9])
    with memory_budget("1GiB"):
        wide = SlidingWindow(window=10**10)(b.x, b.batch)
    exact = SlidingWindow(window=16)(b.x, b.batch)
    assert torch.equal(wide.edge_index, exact.edge_index)


# --------------------------------------------------------------------------- the budget settings
def test_a_tiny_budget_refuses_a_small_case_and_off_lets_it_through():
    b = make_batch([10, 12])
    producer = RandomEdges(k=4)
    with memory_budget(1000):
        with pytest.raises(MemoryBudgetError, match=r"88 edges .* 1000 B"):
            producer(b.x, b.batch)
        with memory_budget("off"):
            assert producer(b.x, b.batch).num_edges == 88
        with pytest.raises(MemoryBudgetError):  # the outer budget is back
            producer(b.x, b.batch)
    assert producer(b.x, b.batch).num_edges == 88  # the default


def test_set_memory_budget_and_reset():
    set_memory_budget("1KiB")
    assert get_memory_budget() == 1024
    assert not within_budget(2000)
    set_memory_budget(0)
    assert get_memory_budget() is None and within_budget(10**30)
    set_memory_budget(None)
    avail = available_memory()
    if avail is not None:  # the default: half of what is available now
        assert get_memory_budget() == pytest.approx(avail / 2, rel=0.25)


def test_the_context_manager_restores_on_error():
    set_memory_budget("3MiB")
    with pytest.raises(RuntimeError), memory_budget("1KiB"):
        assert get_memory_budget() == 1024
        raise RuntimeError
    assert get_memory_budget() == 3 << 20


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 << 30), ("8 gib", 8 << 30), ("8G", 8 << 30), ("8GB", 8 * 10**9), ("512M", 512 << 20),
    ("1.5KiB", 1536), ("1e9", 10**9), ("123", 123), ("10_000", 10_000), (4096, 4096), (1e6, 10**6),
    ("0", None), (0, None), ("off", None), ("none", None), (float("inf"), None),
])
def test_budget_forms(text, expected):
    with memory_budget(text):
        assert get_memory_budget() == expected


def test_percentages_of_the_available_memory():
    avail = available_memory()
    if avail is None:
        pytest.skip("the available memory cannot be read here")
    with memory_budget("10%"):
        assert get_memory_budget() == pytest.approx(avail / 10, rel=0.25)
    with memory_budget("auto"):
        assert get_memory_budget() == pytest.approx(avail / 2, rel=0.25)


@pytest.mark.parametrize("bad", [-1, True, 0.5, float("nan"), "lots", "8XB", "150%", "-3%", [1]])
def test_bad_budgets_are_refused(bad):
    with pytest.raises(ValueError, match="memory budget"):
        set_memory_budget(bad)


def test_the_environment_variable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "2MiB")
    assert get_memory_budget() == 2 << 20
    with pytest.raises(MemoryBudgetError, match=f"from {ENV_VAR}=2MiB"):
        check_edges(10**6, what="a test", how_to_lower="lower it")
    with memory_budget("off"):  # the process setting wins over the environment
        check_edges(10**6, what="a test", how_to_lower="lower it")
    monkeypatch.setenv(ENV_VAR, "off")
    assert get_memory_budget() is None
    monkeypatch.setenv(ENV_VAR, "many")
    with pytest.raises(ValueError, match=ENV_VAR):
        get_memory_budget()


def test_small_estimates_do_not_read_the_free_memory(monkeypatch):
    import graphattn.memory as mem

    def boom(*args):
        raise AssertionError("read the free memory")

    monkeypatch.setattr(mem, "available_memory", boom)
    assert within_budget(10 << 20)  # below the 64 MiB floor of a percentage budget
    check_edges(1000, what="a test", how_to_lower="lower it")


@pytest.mark.skipif(not (sys.platform.startswith("linux") and shutil.which("bash")),
                    reason="ulimit -v and /proc are Linux")
def test_an_address_space_limit_lowers_the_default_budget():
    code = "from graphattn.memory import get_memory_budget; print(get_memory_budget())"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = subprocess.run(["bash", "-c", f"ulimit -v 2000000; {sys.executable} -c '{code}'"],
                         capture_output=True, text=True, env=env, check=True, timeout=120)
    assert 500_000_000 < int(out.stdout) < 1_050_000_000  # half of what is left under 2 GB


def test_the_public_names():
    assert ga.set_memory_budget is set_memory_budget
    assert ga.memory_budget is memory_budget
    assert ga.get_memory_budget is get_memory_budget
    assert issubclass(ga.MemoryBudgetError, ValueError)
    assert ga.memory.check_edges is check_edges
    assert {"set_memory_budget", "memory_budget", "get_memory_budget", "MemoryBudgetError",
            "memory"} <= set(ga.__all__)


# ---------------------------------------------------------------------- ordinary sizes are untouched
SPECS = [
    FullAttention(), KNNEdges(k=3), ExpanderEdges(degree=3), RandomEdges(k=3), SlidingWindow(window=2),
    GlobalTokens(), UnionProducer(["input", {"name": "random", "k": 2}, "virtual"], channels=8),
]


@pytest.mark.parametrize("producer", SPECS, ids=lambda p: type(p).__name__)
def test_ordinary_sizes_pass_without_extra_host_syncs(producer):
    b = make_batch([6, 0, 9, 1, 12])
    layer = EdgeAttention(8, 4, heads=2).double().eval()
    with count_host_syncs() as guarded:
        out = layer(b.x, producer, b.batch, data=b)
    with memory_budget("off"), count_host_syncs() as unguarded:
        ref = layer(b.x, producer, b.batch, data=b)
    assert torch.equal(out, ref)
    assert guarded.total == unguarded.total, (guarded.by_op, unguarded.by_op)
