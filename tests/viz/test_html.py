"""The interactive viewer: a self-contained page, escaped labels, and its behaviour in a real
headless browser (Debian's chromium driven by selenium through the system chromedriver).

The browser tests skip when no browser is installed; ``.ci/run`` installs one so CI runs them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from graphattn.viz import auto_top_k, build_view, render_html, write_html
from graphattn.viz.html import json_for_script, view_payload
from tests.viz.samples import (
    expected_count,
    image_sample,
    molecule_sample,
    node_sample,
    sequence_sample,
    sequence_tokens,
)

EVIL = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    "</script><script>window.__pwned = 3</script>",
    "a & b \u2028 <!-- c",
]
EVIL_TITLE = "<b>bold</b></title><script>window.__pwned = 4</script>"


def _views():
    out = {}
    for name, make in (("graph", molecule_sample), ("sequence", sequence_sample), ("image", image_sample),
                       ("node", node_sample)):
        s = make()
        kw = {"focus": s.focus, "focus_k": 4, "max_nodes": 16} if s.focus is not None else {}
        out[name] = (s, build_view(s.trace, s.data, kind=s.kind, labels=s.labels, title=name, **kw))
    return out


@pytest.fixture(scope="module")
def views():
    return _views()


# ----------------------------------------------------------------------------- page content
def test_json_for_script_escapes_breakouts():
    text = json_for_script({"a": "</script><!-- x & y \u2028\u2029"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"a": "</script><!-- x & y \u2028\u2029"}


def test_page_is_self_contained(views):
    _, view = views["image"]
    page = render_html(view)
    # no external resources: no src/href other than data: URIs, no <link>, no imports or fetches
    assert "<link" not in page and "@import" not in page
    assert not re.search(r"""\b(src|href)\s*=\s*["'](?!data:)""", page)
    for hit in re.findall(r"https?://[^\s\"'<>)]+", page):
        assert hit == "http://www.w3.org/2000/svg"  # the SVG namespace name, never fetched
    for api in ("fetch(", "XMLHttpRequest", "WebSocket", "import(", "eval(", "innerHTML", "document.write"):
        assert api not in page
    # the CSP allows exactly the inline script and style by hash
    script = re.search(r"<script>(.*?)</script>\s*</body>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page.replace("&#x27;", "'")
    assert "default-src 'none'" in page.replace("&#x27;", "'")


def test_payload_matches_view(views):
    _, view = views["graph"]
    p = view_payload(view)
    assert len(p["nodes"]["label"]) == view.num_nodes + view.num_virtual
    for lay, pl in zip(view.layers, p["layers"], strict=True):
        assert pl["src"] == lay.src.tolist() and pl["dst"] == lay.dst.tolist()
        width = 1 if lay.head is not None else lay.num_heads
        assert len(pl["alpha"]) == lay.num_edges * width
    assert {o["name"] for o in p["origins"].values()} == {"input", "expander", "virtual", "sampled"}
    assert p["defaultTopK"] == auto_top_k(view.num_nodes) == 3  # a 25-atom peptide
    assert view_payload(view, top_k=None)["defaultTopK"] == 0
    big = view_payload(view, top_k=None, max_drawn=10)
    assert big["defaultTopK"] >= 1 and any("top-" in n for n in big["notes"])
    small = view_payload(view, max_edges=40)  # the page thins its own copy of a large layer
    assert small["layers"][0]["prunedFrom"] == [view.layers[0].num_edges] * 2
    assert len(small["layers"][0]["src"]) < view.layers[0].num_edges
    assert any("thinned" in n for n in small["notes"]) and view.layers[0].pruned_from is None


def test_labels_and_title_escaped_in_source(views, tmp_path):
    s = sequence_sample(extra_labels=EVIL + sequence_tokens()[len(EVIL):])
    view = build_view(s.trace, s.data, kind="sequence", labels=s.labels, title=EVIL_TITLE)
    page = write_html(view, tmp_path / "evil.html").read_text()
    body = page.split("<body>", 1)[1]
    assert "<script>window" not in page and "<img" not in page and "<b>" not in page
    assert body.count("<script") == 2  # the JSON element and the viewer script, nothing else
    assert "&lt;b&gt;bold&lt;/b&gt;" in page


# ----------------------------------------------------------------------------- in a browser
def _browser_paths() -> tuple[str, str] | None:
    chrome = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                               shutil.which("google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    return (chrome, driver) if chrome and driver else None


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("GRAPHATTN_REQUIRE_BROWSER"):
        from selenium import webdriver
    else:
        webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    paths = _browser_paths()
    if paths is None:
        why = "no chromium/chromedriver installed (apt-get install chromium chromium-driver)"
        if os.environ.get("GRAPHATTN_REQUIRE_BROWSER"):
            pytest.fail(why + "; GRAPHATTN_REQUIRE_BROWSER is set")
        pytest.skip(why)
    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,900"):
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="graphattn-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(paths[1]), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def pages(views, tmp_path_factory):
    root = tmp_path_factory.mktemp("pages")
    # every edge at first (top_k=None), so the tests below can count the traced edges
    return {name: write_html(view, root / f"{name}.html", top_k=None) for name, (_, view) in views.items()}


def open_page(browser, path: Path) -> list[dict]:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(path.as_uri())
    WebDriverWait(browser, 20).until(
        lambda d: d.execute_script("return document.body.getAttribute('data-ready')") == "1")
    return browser.get_log("browser")


def errors(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]]


def drawn(browser) -> int:
    n = len(browser.find_elements("css selector", "#edges .edge"))
    assert int(browser.find_element("id", "count").get_attribute("data-drawn")) == n
    return n


def choose(browser, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", select_id)).select_by_value(value)


@pytest.mark.parametrize("name", ["graph", "sequence", "image", "node"])
def test_page_loads_without_console_errors(browser, pages, name):
    logs = open_page(browser, pages[name])
    assert errors(logs) == []
    assert drawn(browser) > 0


@pytest.mark.parametrize("name", ["graph", "sequence", "image", "node"])
def test_layer_and_head_switch_draw_the_traced_edges(browser, pages, views, name):
    s, view = views[name]
    open_page(browser, pages[name])
    # edges among the view's nodes, counted from the trace itself
    nodes = torch.as_tensor(view.node_index)
    seen = set()
    for li, rec in enumerate(s.trace):
        if view.focus is not None:
            ei = rec.edges.edge_index
            inside = torch.isin(ei[0], nodes) & torch.isin(ei[1], nodes)
            rec = type(rec)(rec.layer, rec.index, rec.edges.select(inside), rec.alpha[inside], rec.batch)
        choose(browser, "layer", str(li))
        for h in [*range(rec.num_heads), None]:
            choose(browser, "head", "mean" if h is None else str(h))
            want = expected_count(rec, nodes if view.focus is None else None, h)
            assert drawn(browser) == want, (li, h)
            assert int(browser.find_element("id", "count").get_attribute("data-total")) == want
            seen.add(want)
    assert len(seen) > 1  # switching really changed what is drawn
    assert errors(browser.get_log("browser")) == []


def test_click_node_shows_its_in_edges(browser, pages, views):
    s, view = views["graph"]
    open_page(browser, pages["graph"])
    for li, h in ((1, 1), (0, 0)):
        choose(browser, "layer", str(li))
        choose(browser, "head", str(h))
        rec = s.trace[li]
        ei = rec.edges.edge_index
        in_head = torch.ones(ei.size(1), dtype=torch.bool) if rec.edges.head is None else rec.edges.head == h
        node = 5
        browser.find_element("css selector", f'#nodes .node[data-id="{node}"]').click()
        assert browser.find_element("id", "selected-label").text == f"{view.labels[node]} #{node}"
        want_in = in_head & (ei[1] == node)
        want_out = in_head & (ei[0] == node) & (ei[1] != node)
        assert int(browser.find_element("id", "in-count").get_attribute("data-count")) == int(want_in.sum())
        assert len(browser.find_elements("css selector", "#edges .edge.in")) == int(want_in.sum())
        assert len(browser.find_elements("css selector", "#edges .edge.out")) == int(want_out.sum())
        rows = browser.find_elements("css selector", "#in-edges li")
        got = sorted(int(r.get_attribute("data-node")) for r in rows)
        N = view.num_nodes
        ref = sorted(int(j) if j < N else N + int(j - N) for j in ei[0][want_in].tolist())
        assert got == ref
        # every other edge is dimmed; clicking empty space clears the selection
        n_dim = len(browser.find_elements("css selector", "#edges .edge.dim"))
        assert n_dim == drawn(browser) - int(want_in.sum()) - int(want_out.sum())
        browser.execute_script("document.getElementById('canvas').dispatchEvent("
                               "new MouseEvent('click', {bubbles: true}))")
        assert browser.find_elements("css selector", "#edges .edge.in") == []
    assert errors(browser.get_log("browser")) == []


def test_top_k_and_origin_toggle(browser, pages, views):
    from selenium.webdriver.common.keys import Keys

    _, view = views["graph"]
    open_page(browser, pages["graph"])
    choose(browser, "layer", "0")
    choose(browser, "head", "0")
    total = drawn(browser)
    virtual = len(view.edges(0, 0, origins=["virtual"]))
    browser.find_element("css selector", '#legend input[data-origin="virtual"]').click()
    assert drawn(browser) == total - virtual
    browser.find_element("css selector", '#legend input[data-origin="virtual"]').click()
    assert drawn(browser) == total
    box = browser.find_element("id", "topk")
    box.clear()
    box.send_keys("1", Keys.TAB)
    assert drawn(browser) == len(view.edges(0, 0, top_k=1)) == len(set(view.edges(0, 0).dst.tolist()))
    assert errors(browser.get_log("browser")) == []


def test_page_opens_at_the_automatic_top_k(browser, views, tmp_path):
    _, view = views["graph"]  # a 25-atom peptide: 3 in-edges per target at first
    open_page(browser, write_html(view, tmp_path / "auto.html"))
    k = auto_top_k(view.num_nodes)
    assert browser.find_element("id", "topk").get_attribute("value") == str(k) == "3"
    assert drawn(browser) == len(view.edges(-1, None, top_k=k)) < len(view.edges(-1, None))
    assert int(browser.find_element("id", "count").get_attribute("data-total")) == len(view.edges(-1, None))
    assert errors(browser.get_log("browser")) == []


def test_script_labels_are_shown_as_text(browser, tmp_path):
    labels = EVIL + sequence_tokens()[len(EVIL):]
    s = sequence_sample(extra_labels=labels)
    view = build_view(s.trace, s.data, kind="sequence", labels=labels, title=EVIL_TITLE)
    logs = open_page(browser, write_html(view, tmp_path / "evil.html"))
    assert errors(logs) == []
    assert browser.execute_script("return window.__pwned === undefined")
    texts = browser.execute_script(
        "return Array.from(document.querySelectorAll('#labels text')).map(t => t.textContent)")
    assert texts == labels
    assert browser.find_element("id", "title").text == EVIL_TITLE
    assert browser.title == EVIL_TITLE
    assert browser.execute_script("return document.querySelectorAll('img, b, #labels script').length") == 0
    browser.find_element("id", "showLabels").click()  # labels off: nodes are not covered by text
    browser.find_element("css selector", '#nodes .node[data-id="0"]').click()
    assert browser.find_element("id", "selected-label").text == f"{EVIL[0]} #0"
    assert browser.execute_script("return window.__pwned === undefined")


def test_stats_table_shows_the_layer_statistics(browser, views, tmp_path):
    """The layers table shows ``layer_statistics`` (the numbers of ``trace.summary()``), and "-"
    for an entropy no target defines (a layer whose targets each have one source)."""
    from dataclasses import replace

    _, view = views["graph"]
    stats = [dict(s) for s in view.stats]
    stats[0]["entropy_normalized"] = None
    logs = open_page(browser, write_html(replace(view, stats=stats), tmp_path / "stats.html"))
    assert errors(logs) == []
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#stats tr')).map("
        "r => Array.from(r.children).map(c => c.textContent))")
    assert rows[0] == ["layer", "edges/node/head", "density", "H nats", "H/log d", "max α"]
    assert len(rows) == len(stats) + 1
    for row, s in zip(rows[1:], stats, strict=True):
        assert row[0] == s["layer"]
        assert float(row[1]) == pytest.approx(s["edges_per_node_head"], abs=0.006)
        assert float(row[3]) == pytest.approx(s["entropy_nats"], abs=6e-4)
        assert row[4] == "-" if s["entropy_normalized"] is None else (
            float(row[4]) == pytest.approx(s["entropy_normalized"], abs=6e-4))


def test_the_layers_table_fits_its_panel(browser, views, tmp_path):
    """At the 1400 x 900 window the tests use, the layers table (long layer names included) is no
    wider than its panel: a long name is cut with an ellipsis and kept whole in the cell's title."""
    from dataclasses import replace

    _, view = views["graph"]
    long_name = "encoder.blocks.0.attention_over_a_very_long_producer_name"
    stats = [{**s, "layer": long_name} for s in view.stats]
    logs = open_page(browser, write_html(replace(view, stats=stats), tmp_path / "wide.html"))
    assert errors(logs) == []
    table, panel, title = browser.execute_script(
        "var t = document.getElementById('stats'); var p = t.closest('aside');"
        "return [t.scrollWidth, p.clientWidth, t.rows[1].cells[0].title];")
    assert table <= panel, (table, panel)
    assert title == long_name
