// Memory gauge front end: the KV pool on a bar of its own scale, all memory on a thin bar
// below, each with a legend. The model holds segments [{name, num_bytes, label, color, kv,
// share}] left to right (memory_gauge.py); share is of the KV pool for kv segments, of all
// memory for the others, so each legend has one base. Colours come from Python (COLORS);
// a hollow segment (reserved, unused) is a frame of its colour, as in the page map.

const SYNCED = [
  "title", "device", "segments", "total_bytes", "total_label", "kv_label", "kv_share", "summary",
];
const MIN_VISIBLE_PX = 2; // a non-empty stretch never vanishes, however small

function el(tag, className, text) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Filled with the segment's colour, or (hollow) framed in it: the CSS draws the frame in
// currentColor.
function paint(node, s) {
  node.classList.toggle("kvlab-memory-gauge-hollow", Boolean(s.hollow));
  if (s.hollow) node.style.color = s.color;
  else node.style.background = s.color;
}

function drawBar(bar, segments) {
  const total = segments.reduce((sum, s) => sum + s.num_bytes, 0);
  const parts = segments.map((s) => {
    const part = el("div", "kvlab-memory-gauge-segment");
    part.dataset.segment = s.name;
    paint(part, s);
    part.style.width = `${total > 0 ? (100 * s.num_bytes) / total : 0}%`;
    if (s.num_bytes > 0) part.style.minWidth = `${MIN_VISIBLE_PX}px`;
    part.title = `${s.name}: ${s.label} (${(100 * s.share).toFixed(1)}%)`;
    return part;
  });
  bar.replaceChildren(...parts);
}

function drawLegend(legend, segments, extra) {
  const items = segments.map((s) => {
    const item = el("span", "kvlab-memory-gauge-item");
    const box = el("span", "kvlab-memory-gauge-swatch");
    paint(box, s);
    const pct = (100 * s.share).toFixed(1);
    item.append(box, document.createTextNode(`${s.name} ${s.label} (${pct}%)`));
    return item;
  });
  if (extra) items.push(el("span", "kvlab-memory-gauge-item", extra));
  legend.replaceChildren(...items);
}

function render({ model, el: host }) {
  const root = el("div", "kvlab-memory-gauge");
  root.dataset.testid = "kvlab-memory-gauge";
  const title = el("div", "kvlab-memory-gauge-title");
  const bar = el("div", "kvlab-memory-gauge-bar");
  bar.dataset.testid = "kvlab-memory-gauge-bar";
  const legend = el("div", "kvlab-memory-gauge-legend");
  const allTitle = el("div", "kvlab-memory-gauge-all-title");
  const allBar = el("div", "kvlab-memory-gauge-bar kvlab-memory-gauge-all");
  allBar.dataset.testid = "kvlab-memory-gauge-all-bar";
  const allLegend = el("div", "kvlab-memory-gauge-legend");
  const summary = el("div", "kvlab-memory-gauge-summary");
  summary.dataset.testid = "kvlab-memory-gauge-summary";
  root.append(title, bar, legend, allTitle, allBar, allLegend, summary);
  host.append(root);

  let frame = null;
  function redraw() {
    frame = null;
    const segments = model.get("segments");
    const total = model.get("total_bytes");
    const name = model.get("title");
    const kv = segments.filter((s) => s.kv);
    const others = segments.filter((s) => !s.kv);
    title.textContent = `${name ? `${name}: ` : ""}${model.get("kv_label")} KV pool`;
    drawBar(bar, kv);
    drawLegend(legend, kv);
    allTitle.textContent = `all memory, ${model.get("total_label")} (${model.get("device")}):`;
    drawBar(allBar, segments);
    const pool = `and the KV pool (${(100 * model.get("kv_share")).toFixed(1)}%), split as above`;
    drawLegend(allLegend, others, pool);
    summary.textContent = model.get("summary");
    root.dataset.totalBytes = String(total);
    root.dataset.drawnSegments = String(segments.length);
  }
  function schedule() {
    if (frame === null) frame = requestAnimationFrame(redraw);
  }
  for (const key of SYNCED) model.on(`change:${key}`, schedule);
  redraw();

  return () => {
    for (const key of SYNCED) model.off(`change:${key}`, schedule);
    if (frame !== null) cancelAnimationFrame(frame);
  };
}

export default { render };
