// Memory gauge front end: a stacked horizontal bar plus a legend of labelled byte counts.
// The model holds segments [{name, num_bytes, label, color}] left to right (memory_gauge.py).

const SYNCED = ["title", "device", "segments", "total_bytes", "total_label", "summary"];
const MIN_VISIBLE_PX = 2; // a non-empty stretch never vanishes, however small

function el(tag, className, text) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function percent(part, total) {
  return total > 0 ? (100 * part) / total : 0;
}

function drawBar(bar, segments, total) {
  const parts = segments.map((s) => {
    const part = el("div", "kvlab-memory-gauge-segment");
    part.dataset.segment = s.name;
    part.style.background = s.color;
    part.style.width = `${percent(s.num_bytes, total)}%`;
    if (s.num_bytes > 0) part.style.minWidth = `${MIN_VISIBLE_PX}px`;
    part.title = `${s.name}: ${s.label} (${percent(s.num_bytes, total).toFixed(1)}%)`;
    return part;
  });
  bar.replaceChildren(...parts);
}

function drawLegend(legend, segments, total) {
  const items = segments.map((s) => {
    const item = el("span", "kvlab-memory-gauge-item");
    const box = el("span", "kvlab-memory-gauge-swatch");
    box.style.background = s.color;
    const pct = percent(s.num_bytes, total).toFixed(1);
    item.append(box, document.createTextNode(`${s.name} ${s.label} (${pct}%)`));
    return item;
  });
  legend.replaceChildren(...items);
}

function render({ model, el: host }) {
  const root = el("div", "kvlab-memory-gauge");
  root.dataset.testid = "kvlab-memory-gauge";
  const title = el("div", "kvlab-memory-gauge-title");
  const bar = el("div", "kvlab-memory-gauge-bar");
  bar.dataset.testid = "kvlab-memory-gauge-bar";
  const legend = el("div", "kvlab-memory-gauge-legend");
  const summary = el("div", "kvlab-memory-gauge-summary");
  summary.dataset.testid = "kvlab-memory-gauge-summary";
  root.append(title, bar, legend, summary);
  host.append(root);

  let frame = null;
  function redraw() {
    frame = null;
    const segments = model.get("segments");
    const total = model.get("total_bytes");
    const name = model.get("title");
    title.textContent = `${name ? `${name}: ` : ""}${model.get("total_label")} (${model.get("device")})`;
    drawBar(bar, segments, total);
    drawLegend(legend, segments, total);
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
