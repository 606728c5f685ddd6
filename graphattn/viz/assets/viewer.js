/* graphattn attention-graph viewer. Reads the JSON payload embedded in the page, draws SVG.
 * Every label is inserted with textContent / createTextNode (never as markup).
 * Edge lists follow graphattn.viz.view: one head = the traced edges of that head, duplicates kept;
 * mean = one edge per distinct (source, target), weight = sum over heads and copies / H, origin of
 * the first copy. Pruning: |w| >= threshold, then each target's top-k |w| (ties: earlier first). */
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var D = JSON.parse(document.getElementById("graphattn-data").textContent);
  var N = D.nodes.x.length;
  var nReal = D.numReal;
  var $ = function (id) { return document.getElementById(id); };

  var state = {
    layer: Math.max(D.layers.length - 1, 0),
    head: "mean",
    colorBy: "origin",
    topK: D.defaultTopK || 0,
    threshold: 0,
    hidden: {},
    selected: null,
    labels: !!D.labelsDefault,
    input: false
  };
  var current = null; // the drawn edge list {src, dst, w, o, n}

  // ------------------------------------------------------------------ geometry
  var X = D.nodes.x, Y = D.nodes.y.map(function (v) { return -v; }); // SVG y grows downwards
  var bbox = (function () {
    var x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (var i = 0; i < N; i++) {
      x0 = Math.min(x0, X[i]); x1 = Math.max(x1, X[i]); y0 = Math.min(y0, Y[i]); y1 = Math.max(y1, Y[i]);
    }
    if (D.background) {
      x0 = Math.min(x0, D.background.x0); x1 = Math.max(x1, D.background.x1);
      y0 = Math.min(y0, -D.background.y1); y1 = Math.max(y1, -D.background.y0);
    }
    if (!isFinite(x0)) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    if (D.arcs) { var h = (x1 - x0) / 2; y0 = Math.min(y0, -h); y1 = Math.max(y1, h); }
    return { x0: x0, x1: x1, y0: y0, y1: y1 };
  })();
  var span = Math.max(bbox.x1 - bbox.x0, bbox.y1 - bbox.y0, 1e-9);
  var R = (function () { // node radius: a third of the typical spacing
    if (D.kind === "sequence") return 0.32;
    if (D.kind === "image") return 0.22;
    if (D.nodeRadius > 0) return D.nodeRadius; // by node count and spacing (graphattn.viz.html.node_radius)
    var area = Math.max((bbox.x1 - bbox.x0) * (bbox.y1 - bbox.y0), span * span * 0.05);
    return Math.max(0.2 * Math.sqrt(area / Math.max(N, 1)), span * 0.004);
  })();
  var pad = Math.max(0.05 * span, 2 * R);
  var home = [bbox.x0 - pad, bbox.y0 - pad, bbox.x1 - bbox.x0 + 2 * pad, bbox.y1 - bbox.y0 + 2 * pad];
  var vb = home.slice();
  var svg = $("canvas");
  function applyViewBox() { svg.setAttribute("viewBox", vb.join(" ")); }
  applyViewBox();

  function el(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]); }
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmt(w) {
    var a = Math.abs(w);
    if (a === 0) return "0";
    return (a >= 1e-3 && a < 1e4) ? w.toFixed(4) : w.toExponential(3);
  }
  function nodeName(i) { // label, plus the node's id in the data when that tells nodes apart
    var idx = D.nodes.index[i];
    return idx >= 0 && String(idx) !== D.nodes.label[i] ? D.nodes.label[i] + " #" + idx : D.nodes.label[i];
  }
  function originOf(code) { return D.origins[String(code)] || { name: "unknown", color: "#7f7f7f" }; }

  // ------------------------------------------------------------------ edge lists
  function edgesFor(li, head) {
    var L = D.layers[li], E = L.src.length, H = L.heads;
    var src = [], dst = [], w = [], o = [];
    if (head !== "mean") {
      var h = +head;
      for (var e = 0; e < E; e++) {
        if (L.head !== null && L.head[e] !== h) continue;
        src.push(L.src[e]); dst.push(L.dst[e]); o.push(L.origin[e]);
        w.push(L.head !== null ? L.alpha[e] : L.alpha[e * H + h]);
      }
    } else {
      var slot = new Map();
      for (var f = 0; f < E; f++) {
        var key = L.dst[f] * N + L.src[f];
        var s = 0;
        if (L.head !== null) s = L.alpha[f];
        else for (var g = 0; g < H; g++) s += L.alpha[f * H + g];
        var k = slot.get(key);
        if (k === undefined) {
          slot.set(key, src.length);
          src.push(L.src[f]); dst.push(L.dst[f]); o.push(L.origin[f]); w.push(s);
        } else { w[k] += s; }
      }
      for (var m = 0; m < w.length; m++) w[m] /= H;
    }
    return { src: src, dst: dst, w: w, o: o };
  }

  function prune(list, topK, threshold, hidden) {
    var idx = [];
    for (var e = 0; e < list.src.length; e++) {
      if (hidden[list.o[e]]) continue;
      if (threshold > 0 && !(Math.abs(list.w[e]) >= threshold)) continue;
      idx.push(e);
    }
    if (topK > 0) {
      idx.sort(function (a, b) {
        return (list.dst[a] - list.dst[b]) || (Math.abs(list.w[b]) - Math.abs(list.w[a])) || (a - b);
      });
      var keep = [], run = 0;
      for (var i = 0; i < idx.length; i++) {
        run = (i > 0 && list.dst[idx[i]] === list.dst[idx[i - 1]]) ? run + 1 : 0;
        if (run < topK) keep.push(idx[i]);
      }
      idx = keep;
    }
    return idx;
  }

  // ------------------------------------------------------------------ colours
  var viridis = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
  function weightColor(rel) { return viridis[Math.min(viridis.length - 1, Math.max(0, Math.floor(rel * viridis.length)))]; }
  // one arrowhead, painted with the stroke of the edge that uses it (so highlighting recolours it);
  // edges fade with the element opacity, which covers their arrowheads too
  var markerId = null;
  function marker() {
    if (markerId) return markerId;
    var m = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: String(0.6 * R),
      markerHeight: String(0.6 * R), markerUnits: "userSpaceOnUse", orient: "auto" });
    m.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "context-stroke" }));
    $("markers").appendChild(m);
    markerId = "arrow";
    return markerId;
  }

  // ------------------------------------------------------------------ static layers
  function drawBackground() {
    if (!D.background) return;
    var b = D.background;
    var img = el("image", { x: b.x0, y: -b.y1, width: b.x1 - b.x0, height: b.y1 - b.y0, preserveAspectRatio: "none", opacity: "0.85" });
    img.setAttribute("href", b.href);
    $("background").appendChild(img);
  }

  function nodeShape(i) {
    var t = D.nodes.type[i], x = X[i], y = Y[i], r = R, shape;
    if (t === 2) shape = el("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r, fill: "#ffe0f0" });
    else if (t === 1) shape = el("path", { d: "M" + x + "," + (y - 1.3 * r) + " L" + (x + 1.3 * r) + "," + y + " L" + x + "," + (y + 1.3 * r) + " L" + (x - 1.3 * r) + "," + y + " z", fill: "#ffd27f" });
    else shape = el("circle", { cx: x, cy: y, r: r, fill: D.nodes.color ? D.nodes.color[i] : "#f2f2f2" });
    shape.setAttribute("class", "node");
    shape.setAttribute("data-id", String(i));
    if (D.background && t === 0) shape.setAttribute("fill-opacity", "0.12");
    return shape;
  }

  function drawNodes() {
    var g = $("nodes"), lab = $("labels");
    var fs = Math.max(R * 0.9, span * 0.006);
    for (var i = 0; i < N; i++) {
      g.appendChild(nodeShape(i));
      var t = el("text", { x: X[i], y: Y[i] - (D.arcs ? 0 : 0), "font-size": fs, class: "label" });
      t.textContent = D.nodes.label[i];
      lab.appendChild(t);
    }
    if (D.focus !== null && D.focus !== undefined) {
      g.appendChild(el("circle", { cx: X[D.focus], cy: Y[D.focus], r: 1.9 * R, class: "focus-ring" }));
    }
    if (D.inputEdges) {
      var ie = $("inputEdges");
      for (var e = 0; e < D.inputEdges[0].length; e++) {
        var a = D.inputEdges[0][e], b = D.inputEdges[1][e];
        ie.appendChild(el("line", { x1: X[a], y1: Y[a], x2: X[b], y2: Y[b], class: "input-edge" }));
      }
    }
  }

  // ------------------------------------------------------------------ edges
  function edgeElement(s, d, color, width, opacity, arrow) {
    var e;
    if (s === d) {
      e = el("circle", { cx: X[d], cy: Y[d], r: 1.3 * R }); // a self-loop: a halo around the node
    } else if (D.arcs && s < nReal && d < nReal) {
      // earlier (left) sources arc above the line, later ones below: control point at (mid, -(x_d - x_s))
      var cx = (X[s] + X[d]) / 2, cy = (Y[s] + Y[d]) / 2 - (X[d] - X[s]);
      e = el("path", { d: "M" + X[s] + "," + Y[s] + " Q" + cx + "," + cy + " " + X[d] + "," + Y[d] });
    } else {
      var dx = X[d] - X[s], dy = Y[d] - Y[s], len = Math.sqrt(dx * dx + dy * dy) || 1;
      var cut = arrow ? Math.min(1.05 * R, 0.45 * len) : 0;
      e = el("line", { x1: X[s], y1: Y[s], x2: X[d] - dx / len * cut, y2: Y[d] - dy / len * cut });
      if (arrow) e.setAttribute("marker-end", "url(#" + marker() + ")");
    }
    e.setAttribute("stroke", color);
    e.setAttribute("stroke-width", width.toFixed(2));
    e.setAttribute("opacity", opacity.toFixed(3));
    return e;
  }

  function render() {
    var L = D.layers[state.layer];
    var g = $("edges");
    clear(g);
    if (!L) { setCount(0, 0); return; }
    var list = edgesFor(state.layer, state.head);
    var idx = prune(list, state.topK, state.threshold, state.hidden);
    idx.sort(function (a, b) { return Math.abs(list.w[a]) - Math.abs(list.w[b]) || a - b; }); // strongest on top
    var wmax = 0;
    for (var i = 0; i < idx.length; i++) wmax = Math.max(wmax, Math.abs(list.w[idx[i]]));
    var arrows = idx.length <= 600;
    var frag = document.createDocumentFragment();
    for (var j = 0; j < idx.length; j++) {
      var e = idx[j], rel = wmax > 0 ? Math.abs(list.w[e]) / wmax : 0;
      var color = state.colorBy === "origin" ? originOf(list.o[e]).color : weightColor(rel);
      var node = edgeElement(list.src[e], list.dst[e], color, 0.4 + 3.2 * rel, 0.12 + 0.88 * rel, arrows);
      node.setAttribute("class", "edge");
      node.setAttribute("data-e", String(e));
      frag.appendChild(node);
    }
    g.appendChild(frag);
    current = { list: list, idx: idx };
    setCount(idx.length, list.src.length);
    // virtual slots this layer does not use
    var used = L.numVirtual;
    var shapes = $("nodes").querySelectorAll(".node");
    for (var k = 0; k < shapes.length; k++) {
      var id = +shapes[k].getAttribute("data-id");
      shapes[k].classList.toggle("unused", id >= nReal + used);
    }
    renderLegend(list);
    renderStats();
    highlight();
  }

  function setCount(drawn, total) {
    var c = $("count");
    c.setAttribute("data-drawn", String(drawn));
    c.setAttribute("data-total", String(total));
    var L = D.layers[state.layer], extra = "";
    if (L && L.prunedFrom) extra = " (view thinned from " + L.prunedFrom.join("/") + " per head)";
    c.textContent = drawn + " of " + total + " edges" + extra;
  }

  // ------------------------------------------------------------------ selection
  function highlight() {
    var sel = state.selected, edges = $("edges").children, shapes = $("nodes").querySelectorAll(".node");
    for (var s = 0; s < shapes.length; s++) {
      var id = +shapes[s].getAttribute("data-id");
      shapes[s].classList.toggle("selected", sel !== null && id === sel);
      shapes[s].classList.remove("src", "dst");
    }
    var ins = [], outs = [];
    for (var i = 0; i < edges.length; i++) {
      var e = +edges[i].getAttribute("data-e"), a = current.list.src[e], b = current.list.dst[e];
      var isIn = sel !== null && b === sel, isOut = sel !== null && a === sel && !isIn;
      edges[i].classList.toggle("in", isIn);
      edges[i].classList.toggle("out", isOut);
      edges[i].classList.toggle("dim", sel !== null && !isIn && !isOut);
      if (isIn) ins.push(e);
      if (isOut) outs.push(e);
    }
    if (sel !== null) {
      for (var k = 0; k < shapes.length; k++) {
        var nid = +shapes[k].getAttribute("data-id");
        for (var m = 0; m < ins.length; m++) if (current.list.src[ins[m]] === nid) shapes[k].classList.add("src");
        for (var q = 0; q < outs.length; q++) if (current.list.dst[outs[q]] === nid) shapes[k].classList.add("dst");
      }
    }
    renderPanel(ins, outs);
  }

  function edgeRows(ids, other) {
    var ul = document.createElement("ul");
    ids.sort(function (a, b) { return Math.abs(current.list.w[b]) - Math.abs(current.list.w[a]) || a - b; });
    ids.forEach(function (e) {
      var li = document.createElement("li");
      var j = other === "src" ? current.list.src[e] : current.list.dst[e];
      var a = document.createElement("span");
      a.textContent = nodeName(j) + " · " + originOf(current.list.o[e]).name;
      var b = document.createElement("span");
      b.textContent = fmt(current.list.w[e]);
      li.appendChild(a); li.appendChild(b);
      li.setAttribute("data-node", String(j));
      ul.appendChild(li);
    });
    return ul;
  }

  function renderPanel(ins, outs) {
    var p = $("panel");
    clear(p);
    if (state.selected === null) {
      var hint = document.createElement("p");
      hint.className = "hint";
      hint.textContent = "Click a node: what it attends to (its in-edges) and what attends to it (its out-edges).";
      p.appendChild(hint);
      return;
    }
    var i = state.selected;
    var head = document.createElement("p");
    head.id = "selected-label";
    head.textContent = nodeName(i);
    p.appendChild(head);
    var t1 = document.createElement("div");
    t1.className = "in-title";
    t1.id = "in-count";
    t1.setAttribute("data-count", String(ins.length));
    t1.textContent = "attends to (in-edges): " + ins.length;
    p.appendChild(t1);
    var ul1 = edgeRows(ins, "src");
    ul1.id = "in-edges";
    p.appendChild(ul1);
    var t2 = document.createElement("div");
    t2.className = "out-title";
    t2.id = "out-count";
    t2.setAttribute("data-count", String(outs.length));
    t2.textContent = "attended by (out-edges): " + outs.length;
    p.appendChild(t2);
    var ul2 = edgeRows(outs, "dst");
    ul2.id = "out-edges";
    p.appendChild(ul2);
  }

  // ------------------------------------------------------------------ side panels
  function renderLegend(list) {
    var ul = $("legend");
    clear(ul);
    var counts = {};
    for (var e = 0; e < list.o.length; e++) counts[list.o[e]] = (counts[list.o[e]] || 0) + 1;
    Object.keys(D.origins).forEach(function (code) {
      var o = D.origins[code];
      var li = document.createElement("li");
      var box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !state.hidden[code];
      box.setAttribute("data-origin", o.name);
      box.addEventListener("change", function () { state.hidden[code] = !box.checked; render(); });
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = o.color;
      var name = document.createElement("span");
      name.textContent = o.name + " (" + (counts[code] || 0) + ")";
      li.appendChild(box); li.appendChild(sw); li.appendChild(name);
      ul.appendChild(li);
    });
  }

  function renderNodeLegend() {
    var ul = $("nodeLegend");
    if (!D.categories) { ul.parentNode.hidden = true; return; }
    D.categories.forEach(function (c) {
      var li = document.createElement("li");
      var sw = document.createElement("span");
      sw.className = "dot";
      sw.style.background = c.color;
      var name = document.createElement("span");
      name.textContent = c.name;
      li.appendChild(sw); li.appendChild(name);
      ul.appendChild(li);
    });
  }

  function fixed(v, digits) { return v === null || v === undefined ? "-" : v.toFixed(digits); }

  function renderStats() {
    var t = $("stats");
    clear(t);
    var hr = document.createElement("tr");
    ["layer", "edges/node/head", "density", "H nats", "H/log d", "max α"].forEach(function (h) {
      var th = document.createElement("th"); th.textContent = h; hr.appendChild(th);
    });
    t.appendChild(hr);
    D.stats.forEach(function (s, i) {
      var tr = document.createElement("tr");
      if (i === state.layer) tr.className = "current";
      var mass = Object.keys(s.mass_share).map(function (k) { return k + " " + (100 * s.mass_share[k]).toFixed(0) + "%"; }).join(", ");
      tr.title = "attention mass by origin: " + mass +
        "\nH nats: mean attention entropy (nats); H/log d: entropy over log(in-degree), 1 = uniform";
      [s.layer, s.edges_per_node_head.toFixed(2), s.density.toPrecision(3), fixed(s.entropy_nats, 3),
       fixed(s.entropy_normalized, 3), s.max_weight.toFixed(3)].forEach(function (v) {
        var td = document.createElement("td"); td.textContent = String(v); tr.appendChild(td);
      });
      tr.firstChild.title = s.layer; // the full name where the column cuts it
      t.appendChild(tr);
    });
  }

  // ------------------------------------------------------------------ controls
  function fillHeads() {
    var sel = $("head"), L = D.layers[state.layer];
    clear(sel);
    var opt = document.createElement("option");
    opt.value = "mean"; opt.textContent = "mean";
    sel.appendChild(opt);
    for (var h = 0; L && h < L.heads; h++) {
      var o = document.createElement("option");
      o.value = String(h); o.textContent = String(h);
      sel.appendChild(o);
    }
    if (state.head !== "mean" && (!L || +state.head >= L.heads)) state.head = "mean";
    sel.value = String(state.head);
  }

  function setup() {
    var ls = $("layer");
    D.layers.forEach(function (L, i) {
      var o = document.createElement("option");
      o.value = String(i); o.textContent = i + ": " + L.name;
      ls.appendChild(o);
    });
    ls.value = String(state.layer);
    ls.addEventListener("change", function () { state.layer = +ls.value; fillHeads(); render(); });
    $("head").addEventListener("change", function () { state.head = $("head").value; render(); });
    $("colorBy").addEventListener("change", function () { state.colorBy = $("colorBy").value; render(); });
    var tk = $("topk");
    tk.value = String(state.topK);
    tk.addEventListener("change", function () { state.topK = Math.max(0, Math.floor(+tk.value || 0)); render(); });
    var th = $("threshold");
    th.addEventListener("change", function () { state.threshold = Math.max(0, +th.value || 0); render(); });
    var sl = $("showLabels");
    sl.checked = state.labels;
    $("labels").style.display = state.labels ? "" : "none";
    sl.addEventListener("change", function () { $("labels").style.display = sl.checked ? "" : "none"; });
    var si = $("showInput");
    si.disabled = !D.inputEdges;
    $("inputEdges").style.display = "none";
    si.addEventListener("change", function () { $("inputEdges").style.display = si.checked ? "" : "none"; });
    $("reset").addEventListener("click", function () { vb = home.slice(); applyViewBox(); });
    var notes = $("notes");
    (D.notes || []).forEach(function (n) { var d = document.createElement("div"); d.textContent = n; notes.appendChild(d); });
    fillHeads();
  }

  // hover: tooltips for edges and nodes
  var tip = $("tip");
  function showTip(evt, text) {
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = (evt.clientX + 12) + "px";
    tip.style.top = (evt.clientY + 12) + "px";
  }
  svg.addEventListener("mousemove", function (evt) {
    var t = evt.target;
    if (t.classList && t.classList.contains("edge") && current) {
      var e = +t.getAttribute("data-e"), l = current.list, L = D.layers[state.layer];
      showTip(evt, nodeName(l.src[e]) + " \u2192 " + nodeName(l.dst[e]) +
        "\n" + (L.complex ? "|\u03b1| = " : "\u03b1 = ") + fmt(l.w[e]) + "   origin: " + originOf(l.o[e]).name +
        "\nlayer " + L.name + ", head " + state.head);
    } else if (t.classList && t.classList.contains("node")) {
      var i = +t.getAttribute("data-id");
      var kind = i >= nReal ? "virtual source" : (D.nodes.type[i] === 1 ? "CLS" : "node " + D.nodes.index[i]);
      var ins = 0, outs = 0;
      if (current) {
        for (var k = 0; k < current.idx.length; k++) {
          var f = current.idx[k];
          if (current.list.dst[f] === i) ins++;
          if (current.list.src[f] === i) outs++;
        }
      }
      var hop = D.nodes.hop ? "   hop " + D.nodes.hop[i] : "";
      showTip(evt, D.nodes.label[i] + "\n" + kind + hop + "\nin-edges " + ins + ", out-edges " + outs);
    } else {
      tip.hidden = true;
    }
  });
  svg.addEventListener("mouseleave", function () { tip.hidden = true; });

  // click: select a node; click on empty space: clear
  var drag = null, moved = false;
  svg.addEventListener("mousedown", function (evt) { drag = { x: evt.clientX, y: evt.clientY, vb: vb.slice() }; moved = false; });
  window.addEventListener("mousemove", function (evt) {
    if (!drag) return;
    var dx = evt.clientX - drag.x, dy = evt.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { moved = true; svg.classList.add("panning"); }
    if (!moved) return;
    var r = svg.getBoundingClientRect(), s = Math.max(drag.vb[2] / r.width, drag.vb[3] / r.height);
    vb[0] = drag.vb[0] - dx * s; vb[1] = drag.vb[1] - dy * s;
    applyViewBox();
  });
  window.addEventListener("mouseup", function () { drag = null; svg.classList.remove("panning"); });
  svg.addEventListener("click", function (evt) {
    if (moved) { moved = false; return; }
    var t = evt.target;
    if (t.classList && t.classList.contains("node")) state.selected = +t.getAttribute("data-id");
    else state.selected = null;
    highlight();
  });
  svg.addEventListener("wheel", function (evt) {
    evt.preventDefault();
    var r = svg.getBoundingClientRect(), f = evt.deltaY > 0 ? 1.15 : 1 / 1.15;
    var s = Math.max(vb[2] / r.width, vb[3] / r.height);
    var cx = vb[0] + (evt.clientX - r.left) * s, cy = vb[1] + (evt.clientY - r.top) * s;
    vb = [cx - (cx - vb[0]) * f, cy - (cy - vb[1]) * f, vb[2] * f, vb[3] * f];
    applyViewBox();
  }, { passive: false });

  drawBackground();
  drawNodes();
  renderNodeLegend();
  setup();
  render();
  document.body.setAttribute("data-ready", "1");
})();
