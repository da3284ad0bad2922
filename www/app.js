// The demo page: models from `linearize serve` (/models.json), loaded into WebGPU through the
// wasm package, generating side by side while each mixer block's state norm per head is drawn
// as it streams; a needle probe as the haystack grows; memory against context length.
import init, { WebGpu, ModelFiles } from './pkg/linearize_web.js';

const $ = (id) => document.getElementById(id);
const MAX_MODELS = 4;
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728'];
let gpu = null;
const loaded = new Map(); // name → { model, info, panel }

function status(text, state = 'busy') {
  const s = $('status');
  s.textContent = text;
  s.dataset.state = state;
  s.className = state === 'error' || state === 'nowebgpu' ? 'error' : '';
}

function selected() {
  return [...document.querySelectorAll('#models input:checked')].map((c) => JSON.parse(c.value));
}

function listModels(models) {
  const box = $('models');
  box.textContent = '';
  if (models.length === 0) {
    box.textContent = 'No models in $LINEARIZE_HOME: run `linearize fetch teacher`, and distil students into $LINEARIZE_HOME/students/NAME.';
    return;
  }
  models.forEach((m, i) => {
    const label = document.createElement('label');
    const check = document.createElement('input');
    check.type = 'checkbox';
    check.value = JSON.stringify(m);
    check.checked = i < 2;
    check.addEventListener('change', () => {
      const n = selected().length;
      document.querySelectorAll('#models input').forEach((c) => { c.disabled = !c.checked && n >= MAX_MODELS; });
    });
    label.append(check, ` ${m.name} (${m.kind})`);
    box.append(label);
  });
}

async function load(entry) {
  const weights = $('weights').value;
  const key = `${entry.name} ${weights}`;
  if (loaded.has(key)) return loaded.get(key);
  const files = new ModelFiles(entry.base);
  let bytes = 0;
  for (const name of entry.files) {
    status(`${entry.name}: fetching ${name}…`);
    const r = await fetch(entry.base + name);
    if (!r.ok) throw new Error(`${entry.base}${name}: HTTP ${r.status}`);
    const data = new Uint8Array(await r.arrayBuffer());
    bytes += data.length;
    files.add(name, data);
  }
  status(`${entry.name}: uploading ${(bytes / 2 ** 20).toFixed(0)} MiB of weights to the GPU…`);
  let model;
  try {
    model = await gpu.load_model_as(files, weights);
  } catch (e) {
    throw new Error(`${entry.name} could not be loaded: ${e.message || e}`);
  }
  const info = JSON.parse(model.info_json());
  const it = { model, info, panel: makePanel(entry.name, info), columns: [], color: COLORS[loaded.size % COLORS.length] };
  loaded.set(key, it);
  return it;
}

function makePanel(name, info) {
  const panel = document.createElement('div');
  panel.className = 'panel';
  panel.dataset.model = name;
  const title = document.createElement('h3');
  title.textContent = `${name} — ${info.kind === 'teacher' ? 'softmax attention (teacher)' : info.mixer}`
    + ` · ${info.weights} weights, ${(info.weight_bytes / 2 ** 20).toFixed(0)} MiB`;
  const text = document.createElement('pre');
  text.className = 'text';
  const heat = document.createElement('canvas');
  heat.className = 'heatmap';
  heat.width = 320;
  heat.height = 180;
  const caption = document.createElement('div');
  caption.className = 'note';
  caption.textContent = info.kind === 'teacher'
    ? 'no fixed state: the KV cache grows with every token'
    : `‖S‖ per head (rows: ${info.mixer_layers.length} blocks × ${info.heads} heads; columns: tokens; log colour scale)`;
  const needles = document.createElement('div');
  needles.className = 'needles';
  panel.append(title, text, heat, caption, needles);
  $('panels').append(panel);
  return panel;
}

// log10 of a norm mapped onto dark blue → teal → yellow.
function shade(t) {
  const stops = [[68, 1, 84], [33, 145, 140], [253, 231, 37]];
  const x = Math.min(Math.max(t, 0), 1) * 2;
  const i = Math.min(Math.floor(x), 1);
  const f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function drawHeatmap(it) {
  const canvas = it.panel.querySelector('canvas.heatmap');
  const g = canvas.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, canvas.width, canvas.height);
  canvas.dataset.columns = it.columns.length;
  if (it.info.kind === 'teacher' || it.columns.length === 0) {
    g.fillStyle = '#888';
    g.font = '13px sans-serif';
    g.fillText(it.info.kind === 'teacher' ? 'attention: no fixed-size state' : 'waiting for tokens…', 10, 20);
    return;
  }
  const rows = it.columns[0].length;
  const logs = it.columns.flatMap((c) => Array.from(c, (v) => Math.log10(Math.max(v, 1e-6))));
  const lo = Math.min(...logs), hi = Math.max(...logs);
  const w = canvas.width / it.columns.length, h = canvas.height / rows;
  it.columns.forEach((col, x) => {
    col.forEach((v, y) => {
      g.fillStyle = shade(hi > lo ? (Math.log10(Math.max(v, 1e-6)) - lo) / (hi - lo) : 0.5);
      g.fillRect(x * w, y * h, Math.ceil(w), Math.ceil(h));
    });
  });
}

function drawMemory() {
  const canvas = $('memory');
  const g = canvas.getContext('2d');
  const [W, H, L, B] = [canvas.width, canvas.height, 70, 30];
  g.fillStyle = '#fff';
  g.fillRect(0, 0, W, H);
  const models = [...loaded.entries()];
  canvas.dataset.lines = models.length;
  const maxT = 8192;
  const maxY = Math.max(1, ...models.map(([, it]) => it.model.memory_bytes(maxT))) / 2 ** 20;
  g.strokeStyle = '#999';
  g.beginPath();
  g.moveTo(L, 10);
  g.lineTo(L, H - B);
  g.lineTo(W - 10, H - B);
  g.stroke();
  g.fillStyle = '#333';
  g.font = '12px sans-serif';
  g.fillText(`${maxY.toFixed(0)} MiB`, 5, 16);
  g.fillText('0', L - 12, H - B);
  g.fillText('context (tokens) →', W / 2 - 50, H - 8);
  g.fillText(`${maxT}`, W - 40, H - B + 14);
  models.forEach(([name, it], i) => {
    g.strokeStyle = it.color;
    g.lineWidth = 2;
    g.beginPath();
    for (let k = 0; k <= 64; k++) {
      const t = (k / 64) * maxT;
      const x = L + (k / 64) * (W - L - 10), y = H - B - (it.model.memory_bytes(t) / 2 ** 20 / maxY) * (H - B - 10);
      if (k === 0) g.moveTo(x, y); else g.lineTo(x, y);
    }
    g.stroke();
    g.fillStyle = it.color;
    const kind = it.info.kind === 'teacher' ? 'KV cache' : 'fixed state';
    g.fillText(`${name}: ${kind}`, L + 10, 24 + 16 * i);
  });
}

async function generate() {
  const models = selected();
  if (models.length === 0) return status('Pick at least one model.', 'error');
  const prompt = $('prompt').value;
  const tokens = Number($('tokens').value) || 16;
  for (const entry of models) {
    const it = await load(entry);
    drawMemory();
    status(`${entry.name}: generating…`);
    const pre = it.panel.querySelector('pre.text');
    pre.textContent = prompt;
    it.columns = [];
    await it.model.generate(prompt, tokens, (piece, id, norms) => {
      pre.textContent += piece;
      if (norms.length) it.columns.push(norms);
      drawHeatmap(it);
    });
    drawHeatmap(it);
  }
  status(`ready: ${models.map((m) => m.name).join(', ')} generated ${tokens} tokens each`, 'ready');
}

async function needles() {
  const lengths = $('lengths').value.split(',').map(Number).filter((n) => n > 0);
  for (const entry of selected()) {
    const it = await load(entry);
    const box = it.panel.querySelector('.needles');
    box.textContent = 'needle at 50 %: ';
    for (const n of lengths) {
      status(`${entry.name}: needle in ${n} tokens…`);
      const r = JSON.parse(await it.model.niah(n, 50, 1));
      const span = document.createElement('span');
      span.className = r.correct ? 'hit' : 'miss';
      span.title = `answer ${r.answer}, generated ${JSON.stringify(r.generated)}`;
      span.textContent = `${n}: ${r.correct ? '✓' : '✗'}`;
      box.append(span);
    }
  }
  status('ready: needle probe done', 'ready');
}

async function main() {
  if (!navigator.gpu) {
    status('This browser has no WebGPU (navigator.gpu is missing). Use a recent Chrome or Edge, or Firefox with WebGPU enabled; nothing can run here without it.', 'nowebgpu');
    return;
  }
  await init();
  try {
    gpu = await WebGpu.create();
  } catch (e) {
    status(`WebGPU is present but no adapter could be used: ${e.message || e}`, 'nowebgpu');
    return;
  }
  const list = await (await fetch('/models.json')).json();
  listModels(list.models);
  const guard = (f) => async () => {
    $('run').disabled = $('needle').disabled = true;
    try { await f(); } catch (e) { status(String(e.message || e), 'error'); }
    $('run').disabled = $('needle').disabled = false;
  };
  $('run').addEventListener('click', guard(generate));
  $('needle').addEventListener('click', guard(needles));
  $('run').disabled = $('needle').disabled = list.models.length === 0;
  status(`ready on ${JSON.parse(gpu.adapter_json()).name}`, 'ready');
}

main().catch((e) => status(String(e.message || e), 'error'));
