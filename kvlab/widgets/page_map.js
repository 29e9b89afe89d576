// Page map front end: draws one cell per KV block on a single <canvas>.
// The model holds parallel lists indexed by block_id (see page_map.py): owner (first
// holder's seq_id, null when free), ref_cnt, logical_index, num_filled, cached (0/1),
// plus shared_seq_ids {block_id: holders}, colors {seq_id: css color} and legend
// [[key, label]]: exactly the states drawn now, worked out in Python (legend_entries), and
// palette {free, cached, cached_hatch, outline, unknown_seq, background}: every colour this
// file paints comes from Python (svg.PAGE_MAP_COLORS), where tests/test_colours.py checks
// it; none is written here.
const MIN_CELL = 4; // below this a cell stops being readable; the canvas grows taller instead
const MAX_CELL = 28;
const MAX_HEIGHT = 420;
const FALLBACK_WIDTH = 640; // before the output area has a width
const MAX_WIDTH = 960;
const SYNCED = [
  "title", "block_size", "num_blocks", "owner", "ref_cnt", "logical_index",
  "num_filled", "cached", "shared_seq_ids", "colors", "legend", "summary", "palette",
  "max_height",
];

// Biggest cell whose grid fits maxHeight (MAX_HEIGHT unless the widget says) at this width.
function layout(numBlocks, width, maxHeight = MAX_HEIGHT) {
  for (let cell = MAX_CELL; cell > MIN_CELL; cell--) {
    const cols = Math.max(1, Math.floor(width / cell));
    if (Math.ceil(numBlocks / cols) * cell <= maxHeight) return { cell, cols };
  }
  return { cell: MIN_CELL, cols: Math.max(1, Math.floor(width / MIN_CELL)) };
}

function readState(model) {
  const s = {};
  for (const key of SYNCED) s[key] = model.get(key);
  return s;
}

function fillFraction(s, i) {
  if (!s.block_size) return s.num_filled[i] > 0 ? 1 : 0;
  return Math.min(1, s.num_filled[i] / s.block_size);
}

function hatch(ctx, x, y, size, palette) {
  ctx.save();
  ctx.beginPath();
  ctx.rect(x, y, size, size);
  ctx.clip();
  ctx.strokeStyle = palette.cached_hatch;
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let d = -size; d < size; d += 4) {
    ctx.moveTo(x + d, y + size);
    ctx.lineTo(x + d + size, y);
  }
  ctx.stroke();
  ctx.restore();
}

function drawSharedMark(ctx, x, y, size, refCnt, palette) {
  const lw = size >= 10 ? 2 : 1;
  ctx.strokeStyle = palette.outline;
  ctx.lineWidth = lw;
  ctx.strokeRect(x + lw / 2, y + lw / 2, size - lw, size - lw);
  if (size < 14) return;
  ctx.font = `bold ${Math.floor(size * 0.55)}px sans-serif`;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  ctx.lineWidth = 3;
  ctx.strokeStyle = palette.background;
  ctx.strokeText(String(refCnt), x + size / 2, y + size / 2 + 1);
  ctx.fillStyle = palette.outline;
  ctx.fillText(String(refCnt), x + size / 2, y + size / 2 + 1);
}

// Draws block i; adds the legend keys of what it drew to `drawn` (a Set), so that the
// browser test can compare the legend (worked out in Python) with what was painted.
function drawCell(ctx, s, i, x, y, size, drawn) {
  const palette = s.palette;
  const seq = s.owner[i];
  if (seq === null || seq === undefined) {
    ctx.fillStyle = s.cached[i] ? palette.cached : palette.free;
    ctx.fillRect(x, y, size, size);
    // Hatched at every size: cached and free differ little in colour for some readers.
    if (s.cached[i]) hatch(ctx, x, y, size, palette);
    drawn.add(s.cached[i] ? "cached" : "free");
    return;
  }
  // A shared block shows every holder: one vertical stripe each. A stripe is solid up to
  // its fill level; a reserved one is hollow above it, framed in the holder's colour, so
  // that it differs from a free cell in shape, not only in colour (as svg.py draws it).
  const holders = s.shared_seq_ids[String(i)] || [seq];
  const stripe = size / holders.length;
  const frac = fillFraction(s, i);
  const filled = Math.round(size * frac);
  const lw = size >= 14 ? 2 : 1; // svg.frame_px
  if (frac < 1) drawn.add("reserved");
  holders.forEach((holder, k) => {
    drawn.add(`seq ${holder}`);
    const color = s.colors[String(holder)] || palette.unknown_seq;
    const sx = x + k * stripe;
    if (frac < 1) {
      ctx.fillStyle = palette.background;
      ctx.fillRect(sx, y, stripe, size);
      ctx.strokeStyle = color;
      ctx.lineWidth = lw;
      ctx.strokeRect(sx + lw / 2, y + lw / 2, stripe - lw, size - lw);
    }
    ctx.fillStyle = color;
    ctx.fillRect(sx, y + size - filled, stripe, filled);
  });
  if (s.cached[i] && size >= 10) {
    // A held block that already has a block_hash: a small white corner.
    ctx.fillStyle = palette.background;
    ctx.beginPath();
    ctx.moveTo(x + size, y);
    ctx.lineTo(x + size - size / 3, y);
    ctx.lineTo(x + size, y + size / 3);
    ctx.fill();
    drawn.add("hashed");
  }
  if (s.ref_cnt[i] > 1 && !s.block_size) {
    // A contiguous arena's cell where two ranges meet: dashed, no count (no sharing).
    ctx.save();
    ctx.strokeStyle = palette.outline;
    ctx.lineWidth = 2;
    ctx.setLineDash([3, 2]);
    ctx.strokeRect(x + 1, y + 1, size - 2, size - 2);
    ctx.restore();
    drawn.add("meet");
  } else if (s.ref_cnt[i] > 1) {
    drawSharedMark(ctx, x, y, size, s.ref_cnt[i], palette);
    drawn.add("shared");
  }
}

function drawMap(canvas, s, width) {
  const n = s.num_blocks;
  const { cell, cols } = layout(n, width, s.max_height || MAX_HEIGHT);
  const rows = Math.max(1, Math.ceil(n / cols));
  const dpr = window.devicePixelRatio || 1;
  const cssW = Math.min(cols, Math.max(n, 1)) * cell;
  const cssH = rows * cell;
  canvas.width = Math.round(cssW * dpr);
  canvas.height = Math.round(cssH * dpr);
  canvas.style.width = `${cssW}px`;
  canvas.style.height = `${cssH}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, cssW, cssH);
  const size = cell >= 8 ? cell - 1 : cell; // a 1px gap once cells are big enough to spare it
  const drawn = new Set();
  for (let i = 0; i < n; i++) {
    drawCell(ctx, s, i, (i % cols) * cell, Math.floor(i / cols) * cell, size, drawn);
  }
  canvas.dataset.drawnBlocks = String(n);
  canvas.dataset.drawnStates = [...drawn].sort().join(",");
  canvas.dataset.cellPx = String(cell);
  return { cell, cols };
}

function tooltipText(s, i) {
  if (!s.block_size) return arenaTooltipText(s, i);
  const lines = [`block ${i}`];
  const seq = s.owner[i];
  if (seq === null || seq === undefined) {
    lines.push(s.cached[i] ? "free, cached: holds a block_hash a prefix hit can reuse" : "free");
    return lines.join("\n");
  }
  const holders = s.shared_seq_ids[String(i)] || [seq];
  lines.push(`${holders.length > 1 ? "seq_ids" : "seq_id"} ${holders.join(", ")}`);
  lines.push(`logical block ${s.logical_index[i]}${holders.length > 1 ? ` (in seq ${seq})` : ""}`);
  lines.push(`ref_cnt ${s.ref_cnt[i]}`);
  lines.push(`tokens ${s.num_filled[i]}${s.block_size ? ` / ${s.block_size}` : ""}`);
  if (s.cached[i]) lines.push("block_hash set (prefix-cacheable)");
  return lines.join("\n");
}

// A contiguous arena's cell (lab 02), in that lab's words: slots in requests' ranges,
// reserved or written; no blocks, ref_cnt, sharing or hashes.
function arenaTooltipText(s, i) {
  const lines = [`cell ${i}`];
  const seq = s.owner[i];
  if (seq === null || seq === undefined) return [...lines, "free: in no seq's range"].join("\n");
  const holders = s.shared_seq_ids[String(i)] || [seq];
  if (holders.length > 1) {
    lines.push(`the ranges of seq ${holders.join(" and seq ")} meet here`);
  } else {
    lines.push(`in seq ${seq}'s range (its cell ${s.logical_index[i]})`);
  }
  const written = s.num_filled[i];
  const slots = `${written} slot${written === 1 ? "" : "s"} written`;
  lines.push(written ? slots : "reserved: no slot written yet");
  return lines.join("\n");
}

function swatch(label, style) {
  const item = document.createElement("span");
  item.className = "kvlab-legend-item";
  const box = document.createElement("span");
  box.className = "kvlab-swatch";
  Object.assign(box.style, style);
  item.append(box, document.createTextNode(label));
  return item;
}

// The legend's swatch of each state, drawn as the map draws it (any seq: unknown_seq).
function swatchStyle(key, p) {
  const frame = (line) => ({ background: p.background, outline: line, outlineOffset: "-2px" });
  return {
    free: { background: p.free },
    cached: {
      background: `repeating-linear-gradient(135deg, ${p.cached} 0 2px, ${p.cached_hatch} 2px 3px)`,
    },
    reserved: {
      background: `linear-gradient(to top, ${p.unknown_seq} 33%, ${p.background} 33%)`,
      outline: `2px solid ${p.unknown_seq}`,
      outlineOffset: "-2px",
    },
    shared: frame(`2px solid ${p.outline}`),
    meet: frame(`2px dashed ${p.outline}`),
    hashed: { background: `linear-gradient(225deg, ${p.background} 28%, ${p.unknown_seq} 28%)` },
  }[key];
}

function drawLegend(legend, s) {
  const items = s.legend.map(([key, label]) => {
    if (key === "more") {
      const more = document.createElement("span");
      more.className = "kvlab-legend-item";
      more.textContent = label;
      return more;
    }
    const seq = key.startsWith("seq ") ? key.slice(4) : null;
    const style = seq !== null
      ? { background: s.colors[seq] || s.palette.unknown_seq } : swatchStyle(key, s.palette);
    const item = swatch(label, style);
    item.dataset.key = key;
    return item;
  });
  legend.replaceChildren(...items);
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "kvlab-page-map-root";
  root.dataset.testid = "kvlab-page-map-root";
  const title = document.createElement("div");
  title.className = "kvlab-page-map-title";
  const canvas = document.createElement("canvas");
  canvas.className = "kvlab-page-map";
  canvas.dataset.testid = "kvlab-page-map";
  canvas.dataset.drawnBlocks = "0";
  const summary = document.createElement("div");
  summary.className = "kvlab-page-map-summary";
  summary.dataset.testid = "kvlab-page-map-summary";
  const legend = document.createElement("div");
  legend.className = "kvlab-page-map-legend";
  legend.dataset.testid = "kvlab-page-map-legend";
  const tooltip = document.createElement("div");
  tooltip.className = "kvlab-page-map-tooltip";
  tooltip.dataset.testid = "kvlab-page-map-tooltip";
  tooltip.hidden = true;
  root.append(title, canvas, summary, legend);
  el.append(root);
  // NOTE: the tooltip lives in <body> with position: fixed, because output areas clip
  // their children (overflow: hidden) and would cut it after a few lines on small maps.
  document.body.append(tooltip);

  let state = readState(model);
  let grid = { cell: MAX_CELL, cols: 1 };
  let frame = null;

  function redraw() {
    frame = null;
    state = readState(model);
    const width = Math.min(root.clientWidth || FALLBACK_WIDTH, MAX_WIDTH);
    title.textContent = state.title;
    title.hidden = !state.title;
    grid = drawMap(canvas, state, width);
    summary.textContent = state.summary;
    drawLegend(legend, state);
  }
  // Several traitlets change per update; draw once per animation frame.
  function schedule() {
    if (frame === null) frame = requestAnimationFrame(redraw);
  }

  function onMove(event) {
    const rect = canvas.getBoundingClientRect();
    const col = Math.floor((event.clientX - rect.left) / grid.cell);
    const row = Math.floor((event.clientY - rect.top) / grid.cell);
    const i = row * grid.cols + col;
    if (col < 0 || col >= grid.cols || row < 0 || i >= state.num_blocks) {
      tooltip.hidden = true;
      return;
    }
    tooltip.textContent = tooltipText(state, i);
    tooltip.dataset.blockId = String(i);
    tooltip.hidden = false;
    // Keep it inside the window: flip to the pointer's other side near an edge.
    const left = event.clientX + 14 + tooltip.offsetWidth > window.innerWidth
      ? event.clientX - 14 - tooltip.offsetWidth : event.clientX + 14;
    const top = event.clientY + 14 + tooltip.offsetHeight > window.innerHeight
      ? event.clientY - 14 - tooltip.offsetHeight : event.clientY + 14;
    tooltip.style.left = `${Math.max(0, left)}px`;
    tooltip.style.top = `${Math.max(0, top)}px`;
  }
  function onLeave() {
    tooltip.hidden = true;
  }

  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", onLeave);
  for (const key of SYNCED) model.on(`change:${key}`, schedule);
  let lastWidth = 0;
  const resize = new ResizeObserver(() => {
    if (root.clientWidth !== lastWidth) {
      lastWidth = root.clientWidth;
      schedule();
    }
  });
  resize.observe(root);
  redraw();

  return () => {
    for (const key of SYNCED) model.off(`change:${key}`, schedule);
    resize.disconnect();
    tooltip.remove();
    if (frame !== null) cancelAnimationFrame(frame);
  };
}

export default { render };
