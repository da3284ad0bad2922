// The demo page: models from `linearize serve` (models.json) or picked from disk, loaded into
// WebGPU through the wasm package, generating side by side while each mixer block's state norm
// per head is drawn as it streams; a needle probe as the haystack grows; memory against context
// length. Every URL is relative, so the page also works as static files (any web server, any
// folder): without models.json it lists what is picked from disk.
//
// Every input is checked before any work; a run locks the controls and can be stopped; each
// model has one panel, replaced when it runs again and removed (its GPU memory freed) when it
// is unticked; the inputs survive a reload.
import init, { WebGpu, ModelFiles, request_files_json, mixer_names_json } from './pkg/linearize_web.js';

const $ = (id) => document.getElementById(id);
const MAX_MODELS = 4;
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728'];
const LIMITS = { tokens: [1, 256], temperature: [0, 5], seed: [0, 4294967295], length: [1, 8192], promptChars: 4000, docs: [1, 500], textChars: 20000, fitSteps: [1, 500], fitBlock: [0, 63], fitChars: 2000 };
const requestFiles = new Map(); // task → its request file's JSON lines
const picked = new Map(); // model name → { files: Map(file name → File) } picked from disk
const entries = new Map(); // model name → its entry (served or picked), for the live fit's teacher
const pickedTasks = new Map(); // task → its request file (a File) picked from disk
let requestPaths = []; // [task, its request file below the eval folder], from the wasm package
const SAVED = 'linearize.demo.inputs';
const MEMORY_CONTEXT = 8192;

let gpu = null;
let stopRequested = false;
const loaded = new Map(); // model name → { model, info, weights, panel, columns, positions, color }

function status(text, state = 'busy') {
  const s = $('status');
  s.textContent = text;
  s.dataset.state = state;
  s.className = state === 'error' || state === 'nowebgpu' ? 'error' : '';
}

// An error of the wasm package in the page's words: no command-line argument names.
function pageWords(e) {
  const text = String((e && e.message) || e);
  const short = text.match(/(\d+) tokens do not hold the prompt's (\d+) fixed tokens/);
  if (short) return `${short[1]} tokens is too short: the probe's instructions and question alone take ${short[2]} tokens`;
  return text.replace(/^invalid argument [^:]+: /, '');
}

// ---- inputs: checked before any work, remembered across reloads ----

function selected() {
  return [...document.querySelectorAll('#models input:checked')].map((c) => JSON.parse(c.value));
}

function wholeNumber(text, what, [lo, hi]) {
  const t = String(text).trim();
  if (!/^[-+]?[0-9]+$/.test(t)) throw new Error(`${what}: '${t}' is not a whole number (${lo}–${hi})`);
  const n = Number(t);
  if (n < lo || n > hi) throw new Error(`${what}: ${n} is outside ${lo}–${hi}`);
  return n;
}

// A decimal number that `ok` accepts, or an Error naming the field and what it takes.
function decimal(text, what, ok, takes) {
  const t = String(text).trim();
  const x = Number(t);
  if (!/^[0-9]*\.?[0-9]+(e-?[0-9]+)?$/i.test(t) || !ok(x)) throw new Error(`${what}: '${t}' is not ${takes}.`);
  return x;
}

// The run's inputs, or an Error naming the field and what it takes.
function checkedInputs(kind) {
  if (kind === 'fit') return fitInputs();
  const models = selected();
  if (models.length === 0) throw new Error('Pick at least one model.');
  if (models.length > MAX_MODELS) throw new Error(`Pick at most ${MAX_MODELS} models.`);
  const inputs = { models, weights: $('weights').value };
  if (kind === 'generate') {
    inputs.prompt = $('prompt').value;
    if (inputs.prompt.trim() === '') throw new Error('Prompt: write some text to continue.');
    if (inputs.prompt.length > LIMITS.promptChars) throw new Error(`Prompt: ${inputs.prompt.length} characters; at most ${LIMITS.promptChars}.`);
    inputs.tokens = wholeNumber($('tokens').value, 'New tokens', LIMITS.tokens);
    inputs.temperature = decimal($('temperature').value, 'Temperature', (t) => t >= LIMITS.temperature[0] && t <= LIMITS.temperature[1], `a number from ${LIMITS.temperature.join(' to ')} (0: greedy)`);
    inputs.topP = decimal($('topp').value, 'Top-p', (p) => p > 0 && p <= 1, 'a number above 0 and at most 1');
    inputs.seed = wholeNumber($('seed').value, 'Seed', LIMITS.seed);
  } else if (kind === 'zeroshot') {
    inputs.task = $('task').value;
    if (!inputs.task) throw new Error('Task: no request files here — pick one from disk (TASK.jsonl.gz, written by `linearize fetch eval`), or serve them with `linearize serve`.');
    inputs.docs = wholeNumber($('docs').value, 'Documents', LIMITS.docs);
  } else if (kind === 'perplexity') {
    inputs.text = $('ppltext').value;
    if (inputs.text.trim() === '') throw new Error('Text: paste some text to score.');
    if (inputs.text.length > LIMITS.textChars) throw new Error(`Text: ${inputs.text.length} characters; at most ${LIMITS.textChars}.`);
  } else {
    const parts = $('lengths').value.split(',').map((s) => s.trim()).filter((s) => s !== '');
    if (parts.length === 0) throw new Error(`Lengths: give one or more whole numbers (${LIMITS.length.join('–')}), separated by commas.`);
    inputs.lengths = parts.map((p) => wholeNumber(p, 'Lengths', LIMITS.length));
    const depths = $('depths').value.split(',').map((s) => s.trim()).filter((s) => s !== '');
    if (depths.length === 0) throw new Error('Depths: give one or more whole numbers (0–100), separated by commas.');
    inputs.depths = depths.map((p) => wholeNumber(p, 'Depths', [0, 100]));
  }
  return inputs;
}

function fitInputs() {
  const teacher = $('fitteacher').value;
  if (!teacher) throw new Error('Teacher: none here — serve the teacher with `linearize serve`, or pick its .gguf (or directory) from disk above.');
  const text = $('fittext').value;
  if (text.trim() === '') throw new Error('Text: write a few sentences for the teacher to read.');
  if (text.length > LIMITS.fitChars) throw new Error(`Text: ${text.length} characters; at most ${LIMITS.fitChars}.`);
  const t = $('fitlr').value.trim();
  const lr = Number(t);
  if (!/^[0-9.]+(e-?[0-9]+)?$/i.test(t) || !(lr > 0 && lr <= 0.1)) throw new Error(`Learning rate: '${t}' is not a number above 0 and at most 0.1.`);
  return { teacher, text, lr, mixer: $('fitmixer').value, layer: wholeNumber($('fitlayer').value, 'Block', LIMITS.fitBlock), steps: wholeNumber($('fitsteps').value, 'Steps', LIMITS.fitSteps) };
}

function saveInputs() {
  const v = { prompt: $('prompt').value, tokens: $('tokens').value, temperature: $('temperature').value, topp: $('topp').value, seed: $('seed').value, lengths: $('lengths').value, depths: $('depths').value, docs: $('docs').value, task: $('task').value, weights: $('weights').value,
              fitmixer: $('fitmixer').value, fitlayer: $('fitlayer').value, fitsteps: $('fitsteps').value, fitlr: $('fitlr').value,
              shared: $('shared').checked, models: selected().map((m) => m.name) };
  try { localStorage.setItem(SAVED, JSON.stringify(v)); } catch (_) { /* storage may be off */ }
}

function savedInputs() {
  try { return JSON.parse(localStorage.getItem(SAVED) || 'null'); } catch (_) { return null; }
}

function restoreInputs(v) {
  if (!v) return;
  for (const k of ['prompt', 'tokens', 'temperature', 'topp', 'seed', 'lengths', 'depths', 'docs', 'weights', 'fitlayer', 'fitsteps', 'fitlr']) if (typeof v[k] === 'string') $(k).value = v[k];
  if (typeof v.shared === 'boolean') $('shared').checked = v.shared;
}

// served: whether the models came from `linearize serve` (else the page runs as static files).
function listModels(models, saved, served) {
  const box = $('models');
  box.textContent = '';
  if (models.length === 0) {
    box.textContent = served
      ? 'No models in $LINEARIZE_HOME: run `linearize fetch teacher` and distil students into $LINEARIZE_HOME/students/NAME, or pick one from disk below.'
      : 'No `linearize serve` behind this page: pick a student directory or a .gguf from disk below.';
    return;
  }
  const ticked = saved && Array.isArray(saved.models) ? new Set(saved.models) : null;
  models.forEach((m, i) => {
    addModelTick(m, ticked ? ticked.has(m.name) && [...ticked].indexOf(m.name) < MAX_MODELS : i < 2);
  });
  limitTicks();
}

function addModelTick(m, checked) {
  entries.set(m.name, m);
  if (!m.kind.startsWith('student')) $('fitteacher').add(new Option(m.name, m.name));
  const box = $('models');
  if (!box.querySelector('input')) box.textContent = '';
  const label = document.createElement('label');
  const check = document.createElement('input');
  check.type = 'checkbox';
  check.value = JSON.stringify(m);
  check.checked = checked;
  check.addEventListener('change', () => { limitTicks(); dropUnticked(); saveInputs(); });
  label.append(check, ` ${m.name} (${m.kind})`);
  box.append(label);
}

// ---- models and request files picked from disk (no server needed) ----

// The files a model is read from: a student or HF directory's top-level .json and .safetensors
// files, or one .gguf. A folder's files carry their path below it (webkitRelativePath); files
// picked one by one carry none.
function modelFilesOf(files) {
  const top = files.filter((f) => (f.webkitRelativePath || f.name).split('/').length <= 2);
  const gguf = top.filter((f) => f.name.endsWith('.gguf'));
  if (gguf.length > 1) throw new Error(`Pick one .gguf at a time, not ${gguf.length}.`);
  if (gguf.length === 1) return { name: gguf[0].name.replace(/\.gguf$/, ''), kind: 'gguf', files: [gguf[0]] };
  const wanted = top.filter((f) => /\.(json|safetensors)$/.test(f.name));
  const names = new Set(wanted.map((f) => f.name));
  if (!names.has('config.json')) throw new Error('The picked files hold no config.json: pick a student directory (config.json, student.json, tokenizer.json, model.safetensors) or one .gguf.');
  if (![...names].some((n) => n.endsWith('.safetensors'))) throw new Error('The picked files hold no .safetensors weights.');
  const folder = (wanted[0].webkitRelativePath || '').split('/')[0];
  const kind = names.has('student.json') ? 'student' : 'teacher';
  return { name: folder || `picked-${picked.size + 1}`, kind, files: wanted };
}

function pickModel(input) {
  try {
    const m = modelFilesOf([...input.files]);
    let name = m.name;
    for (let i = 2; entries.has(name); i++) name = `${m.name}-${i}`;
    picked.set(name, { files: new Map(m.files.map((f) => [f.name, f])) });
    addModelTick({ name, kind: `${m.kind}, from disk`, disk: true, files: m.files.map((f) => f.name) }, selected().length < MAX_MODELS);
    limitTicks();
    const mib = m.files.reduce((s, f) => s + f.size, 0) / 2 ** 20;
    status(`picked ${name}: ${m.files.length} file${m.files.length === 1 ? '' : 's'}, ${mib.toFixed(0)} MiB (read when it runs)`, 'ready');
  } catch (e) {
    status(e.message, 'error');
  }
  input.value = '';
}

// A request file's task: a file named TASK.jsonl.gz (or .jsonl), or the request file of a
// folder picked from the eval folder `linearize fetch eval` writes (…/TASK/SPLIT/requests.jsonl.gz,
// SPLIT the one the native build scores). null for any other file.
function taskOf(file) {
  const named = file.name.match(/^([a-z_]+)\.jsonl(\.gz)?$/);
  if (named && requestPaths.some(([t]) => t === named[1])) return named[1];
  const rel = `/${file.webkitRelativePath || ''}`;
  const hit = requestPaths.find(([, path]) => rel.endsWith(`/${path.split('/').slice(-3).join('/')}`));
  return hit ? hit[0] : null;
}

// folder: the input picks a folder (its other files are passed over), else files one by one.
function pickTasks(input, folder) {
  const taken = [];
  for (const f of input.files) {
    const task = taskOf(f);
    if (task === null) {
      if (folder) continue;
      input.value = '';
      return status(`${f.name}: not a request file — one is named TASK.jsonl.gz (TASK one of ${requestPaths.map(([t]) => t).join(', ')}), or pick the eval folder of \`linearize fetch eval\`.`, 'error');
    }
    pickedTasks.set(task, f);
    requestFiles.delete(task);
    if (![...$('task').options].some((o) => o.value === task)) $('task').add(new Option(task, task));
    taken.push(task);
  }
  input.value = '';
  if (taken.length === 0) return status(`No request file in the picked folder: expected ${requestPaths[0][1]} or a task's folder below it.`, 'error');
  $('task').value = taken[0];
  status(`request files picked: ${taken.join(', ')}`, 'ready');
}

function limitTicks() {
  const n = selected().length;
  document.querySelectorAll('#models input').forEach((c) => { c.disabled = !c.checked && n >= MAX_MODELS; });
}

// ---- a run: controls locked, a stop button, progress ----

function setBusy(busy) {
  document.querySelectorAll('#controls input, #controls select, #controls textarea, #controls button, #models input')
    .forEach((el) => { el.disabled = busy; });
  $('stop').disabled = !busy;
  if (!busy) limitTicks();
}

function run(kind, work) {
  return async () => {
    let inputs;
    try {
      inputs = checkedInputs(kind);
    } catch (e) {
      return status(e.message, 'error');
    }
    saveInputs();
    stopRequested = false;
    setBusy(true);
    try {
      const done = await work(inputs);
      status(stopRequested ? `stopped: ${done}` : `ready: ${done}`, stopRequested ? 'stopped' : 'ready');
    } catch (e) {
      status(pageWords(e), 'error');
    }
    setBusy(false);
  };
}

// ---- models and their panels ----

function free(name) {
  const it = loaded.get(name);
  if (!it) return;
  it.model.free();
  it.panel.remove();
  loaded.delete(name);
}

// Panels of unticked models go, and their weights leave the GPU.
function dropUnticked() {
  const keep = new Set(selected().map((m) => m.name));
  for (const name of [...loaded.keys()]) if (!keep.has(name)) free(name);
  drawMemory();
}

// A model's files as the wasm package takes them: fetched from the server, or read from disk.
async function modelFiles(entry) {
  const files = new ModelFiles(entry.disk ? `${entry.name} (picked from disk)` : entry.base);
  let bytes = 0;
  for (const name of entry.files) {
    let data;
    if (entry.disk) {
      status(`${entry.name}: reading ${name} from disk…`);
      data = new Uint8Array(await picked.get(entry.name).files.get(name).arrayBuffer());
    } else {
      status(`${entry.name}: fetching ${name}…`);
      const r = await fetch(entry.base + name);
      if (!r.ok) throw new Error(`${entry.base}${name}: HTTP ${r.status}`);
      data = new Uint8Array(await r.arrayBuffer());
    }
    bytes += data.length;
    files.add(name, data);
  }
  return { files, bytes };
}

async function load(entry, weights, color) {
  const have = loaded.get(entry.name);
  if (have && have.weights === weights) {
    have.color = color;
    return have;
  }
  free(entry.name); // other weights: this model's one panel is replaced
  const { files, bytes } = await modelFiles(entry);
  status(`${entry.name}: uploading ${(bytes / 2 ** 20).toFixed(0)} MiB of weights to the GPU…`);
  let model;
  try {
    model = await gpu.load_model_as(files, weights);
  } catch (e) {
    throw new Error(`${entry.name} could not be loaded: ${pageWords(e)}`);
  }
  const info = JSON.parse(model.info_json());
  const it = { model, info, weights, panel: makePanel(entry.name, info), columns: [], positions: [], color };
  loaded.set(entry.name, it);
  return it;
}

function makePanel(name, info) {
  const panel = document.createElement('div');
  panel.className = 'panel';
  panel.dataset.model = name;
  const el = (tag, cls) => { const e = document.createElement(tag); e.className = cls; return e; };
  const title = el('h3', 'title');
  title.textContent = `${name} — ${info.kind === 'teacher' ? 'softmax attention (teacher)' : info.mixer}`
    + ` · ${info.weights} weights, ${(info.weight_bytes / 2 ** 20).toFixed(0)} MiB`;
  const progress = el('div', 'progress note');
  const text = el('pre', 'text');
  const heat = el('canvas', 'heatmap');
  heat.width = 420;
  heat.height = info.kind === 'teacher' ? 80 : Math.max(200, info.mixer_layers.length * info.heads + 40);
  const caption = el('div', 'note caption');
  caption.textContent = info.kind === 'teacher'
    ? 'Attention keeps every past key and value: its cache grows by '
      + `${(info.kv_bytes_per_token / 1024).toFixed(0)} KiB with each token.`
    : `‖S‖, the size of each head's state, after the prompt and after each token: rows are heads grouped by block `
      + `(${info.mixer_layers.length} blocks × ${info.heads} heads), columns tokens, colours log-scaled (bar on the right).`;
  const lines = el('canvas', 'lines');
  lines.width = 420;
  lines.height = 150;
  const needles = el('div', 'needles');
  const evals = el('div', 'evals');
  panel.append(title, progress, text, heat, caption);
  if (info.kind !== 'teacher') panel.append(lines);
  panel.append(needles, evals);
  $('panels').append(panel);
  return panel;
}

// ---- drawing ----

// t in [0, 1] onto dark blue → teal → yellow.
function shade(t) {
  const stops = [[68, 1, 84], [33, 145, 140], [253, 231, 37]];
  const x = Math.min(Math.max(t, 0), 1) * 2;
  const i = Math.min(Math.floor(x), 1);
  const f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

const log10 = (v) => Math.log10(Math.max(v, 1e-6));

// The colour scale's range (log10 ‖S‖): this model's, or every student's with "shared scale".
function scaleOf(it) {
  const pool = $('shared').checked ? [...loaded.values()].filter((o) => o.info.kind !== 'teacher') : [it];
  const logs = pool.flatMap((o) => o.columns.flatMap((c) => Array.from(c, log10)));
  if (logs.length === 0) return [0, 1];
  let lo = Infinity, hi = -Infinity;
  for (const v of logs) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return hi > lo ? [lo, hi] : [lo - 0.5, hi + 0.5];
}

function drawHeatmap(it) {
  const canvas = it.panel.querySelector('canvas.heatmap');
  const g = canvas.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, canvas.width, canvas.height);
  canvas.dataset.columns = it.columns.length;
  g.font = '11px sans-serif';
  if (it.info.kind === 'teacher') return drawKvCache(it, canvas, g);
  if (it.columns.length === 0) {
    g.fillStyle = '#888';
    g.fillText('waiting for tokens…', 10, 20);
    return;
  }
  const [L, R, T, B] = [34, 64, 6, 28]; // margins: block labels, colour bar, top, token axis
  const rows = it.columns[0].length, heads = it.info.heads, blocks = rows / heads;
  const [lo, hi] = scaleOf(it);
  canvas.dataset.scale = `${lo.toFixed(3)},${hi.toFixed(3)}`;
  const w = (canvas.width - L - R) / it.columns.length, h = (canvas.height - T - B) / rows;
  it.columns.forEach((col, x) => {
    col.forEach((v, y) => {
      g.fillStyle = shade((log10(v) - lo) / (hi - lo));
      g.fillRect(L + x * w, T + y * h, Math.ceil(w), Math.ceil(h));
    });
  });
  // Block separators and labels (every block when they fit, else every few).
  g.strokeStyle = '#fff';
  g.fillStyle = '#333';
  const every = Math.max(1, Math.ceil(12 / (heads * h)));
  for (let b = 0; b < blocks; b++) {
    const y = T + b * heads * h;
    if (b > 0) { g.beginPath(); g.moveTo(L, y); g.lineTo(canvas.width - R, y); g.stroke(); }
    if (b % every === 0) g.fillText(`L${it.info.mixer_layers[b]}`, 2, y + Math.min(heads * h, 12) - 1);
  }
  // Token axis: the position each column was read at (prompt, then one per token).
  const labels = Math.min(it.columns.length, 6);
  for (let k = 0; k < labels; k++) {
    const x = labels === 1 ? 0 : Math.round((k * (it.columns.length - 1)) / (labels - 1));
    const pos = it.positions[x];
    // The first label starts at its column, the last ends at its own (clear of the colour
    // bar's unit), the others centred on theirs.
    const last = labels > 1 && k === labels - 1;
    g.textAlign = last ? 'right' : k === 0 ? 'left' : 'center';
    const at = last ? L + (x + 1) * w : k === 0 ? L + x * w : L + (x + 0.5) * w;
    g.fillText(pos === undefined ? '' : String(pos), at, canvas.height - B + 12);
  }
  g.textAlign = 'left';
  g.fillText(`tokens seen → (first column: after the prompt)`, L, canvas.height - 4);
  // The colour bar in ‖S‖ units.
  const bx = canvas.width - R + 8, bh = canvas.height - T - B;
  for (let y = 0; y < bh; y++) {
    g.fillStyle = shade(1 - y / bh);
    g.fillRect(bx, T + y, 10, 1);
  }
  g.fillStyle = '#333';
  const fmt = (l) => { const v = 10 ** l; return v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toPrecision(2); };
  g.fillText(fmt(hi), bx + 13, T + 9);
  g.fillText(fmt((lo + hi) / 2), bx + 13, T + bh / 2 + 4);
  g.fillText(fmt(lo), bx + 13, T + bh);
  g.fillText('‖S‖', bx - 2, canvas.height - B + 12);
}

// The teacher's cache against the tokens seen so far. Drawn while the model generates, when
// the model itself cannot be called: the cache's size comes from its info.
function drawKvCache(it, canvas, g) {
  const seen = it.positions.length ? it.positions[it.positions.length - 1] : 0;
  const bytes = it.info.kv_bytes_per_token * seen;
  const full = it.info.kv_bytes_per_token * Math.max(seen, 1) * 2;
  g.fillStyle = '#333';
  g.fillText(`KV cache after ${seen} tokens: ${unit(bytes)} — no fixed-size state`, 10, 18);
  g.fillStyle = it.color;
  g.fillRect(10, 30, (canvas.width - 20) * (full > 0 ? bytes / full : 0), 22);
  g.strokeStyle = '#999';
  g.strokeRect(10, 30, canvas.width - 20, 22);
  g.fillStyle = '#666';
  g.fillText(`(the bar's full width: the cache at twice this context, ${unit(full)})`, 10, 70);
  canvas.dataset.kvBytes = bytes;
}

// Each block's mean ‖S‖ over its heads against position: saturation shows as a line that
// stops growing.
function drawLines(it) {
  const canvas = it.panel.querySelector('canvas.lines');
  if (!canvas) return;
  const g = canvas.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, canvas.width, canvas.height);
  const heads = it.info.heads, blocks = it.info.mixer_layers.length;
  const means = it.columns.map((col) => Array.from({ length: blocks }, (_, b) => {
    let s = 0;
    for (let k = 0; k < heads; k++) s += col[b * heads + k];
    return s / heads;
  }));
  canvas.dataset.points = means.length;
  const [L, R, T, B] = [44, 10, 14, 22];
  g.strokeStyle = '#999';
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, canvas.height - B); g.lineTo(canvas.width - R, canvas.height - B); g.stroke();
  g.fillStyle = '#333';
  g.font = '11px sans-serif';
  g.fillText('mean ‖S‖ per block against tokens seen', L + 4, 10);
  if (means.length === 0) return;
  const all = means.flat();
  const top = Math.max(...all) * 1.05 || 1;
  g.fillText(top.toPrecision(3), 2, T + 8);
  g.fillText('0', L - 10, canvas.height - B);
  const p0 = it.positions[0] ?? 0, p1 = it.positions[it.positions.length - 1] ?? 1;
  g.fillText(String(p0), L, canvas.height - 6);
  g.fillText(String(p1), canvas.width - R - 20, canvas.height - 6);
  for (let b = 0; b < blocks; b++) {
    g.strokeStyle = `hsl(${(b * 360) / blocks}, 60%, 45%)`;
    g.beginPath();
    means.forEach((m, i) => {
      const x = L + (means.length === 1 ? 0 : (i / (means.length - 1)) * (canvas.width - L - R));
      const y = canvas.height - B - (m[b] / top) * (canvas.height - B - T);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  }
}

// Bytes as the page writes them: 4 KiB, 1.3 MiB, 2 GiB.
function unit(b) {
  const [v, u] = b >= 2 ** 30 ? [b / 2 ** 30, 'GiB'] : b >= 2 ** 20 ? [b / 2 ** 20, 'MiB'] : [b / 1024, 'KiB'];
  return `${v >= 10 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, '')} ${u}`;
}

// Memory held against context on a log axis (ticks at every factor of 8 from 1 KiB); the legend
// sits right of the plot.
function drawMemory() {
  const canvas = $('memory');
  const g = canvas.getContext('2d');
  const [W, H, L, R, T, B] = [canvas.width, canvas.height, 64, 250, 12, 34];
  g.fillStyle = '#fff';
  g.fillRect(0, 0, W, H);
  const models = [...loaded.entries()];
  canvas.dataset.lines = models.length;
  // From the first sampled context on: at 0 tokens the teacher holds nothing, off a log axis.
  const samples = (it) => Array.from({ length: 64 }, (_, k) => it.model.memory_bytes(((k + 1) / 64) * MEMORY_CONTEXT));
  const all = models.flatMap(([, it]) => samples(it)).filter((b) => b > 0);
  const lo = Math.min(10, Math.floor(Math.log2(Math.min(...all, 2 ** 20)))), hi = Math.max(20, Math.ceil(Math.log2(Math.max(...all, 1))));
  const y = (bytes) => H - B - ((Math.log2(Math.max(bytes, 2 ** lo)) - lo) / (hi - lo)) * (H - B - T);
  const x = (k) => L + ((k + 1) / 64) * (W - L - R);
  g.strokeStyle = '#999';
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, H - B); g.lineTo(W - R, H - B); g.stroke();
  g.font = '12px sans-serif';
  g.fillStyle = '#333';
  for (let e = lo; e <= hi; e++) {
    if ((e - 10) % 3 !== 0) continue;
    g.strokeStyle = '#eee';
    g.beginPath(); g.moveTo(L + 1, y(2 ** e)); g.lineTo(W - R, y(2 ** e)); g.stroke();
    g.fillText(unit(2 ** e), 2, y(2 ** e) + 4);
  }
  for (const t of [0, 2048, 4096, 6144, 8192]) g.fillText(String(t), L + (t / MEMORY_CONTEXT) * (W - L - R) - 10, H - B + 14);
  g.fillText('context (tokens) →', (W - R) / 2 - 30, H - 4);
  models.forEach(([name, it], i) => {
    const pts = samples(it);
    g.strokeStyle = it.color;
    g.lineWidth = 2;
    g.beginPath();
    pts.forEach((b, k) => (k === 0 ? g.moveTo(x(k), y(b)) : g.lineTo(x(k), y(b))));
    g.stroke();
    g.lineWidth = 1;
    g.fillStyle = it.color;
    g.fillRect(W - R + 12, T + 4 + 34 * i, 14, 4);
    g.fillStyle = '#333';
    g.fillText(name, W - R + 32, T + 10 + 34 * i);
    const at = it.model.memory_bytes(MEMORY_CONTEXT);
    g.fillText(`${it.info.kind === 'teacher' ? 'KV cache' : 'fixed state'}: ${unit(at)} at ${MEMORY_CONTEXT}`, W - R + 32, T + 24 + 34 * i);
  });
}

function redrawAll() {
  for (const it of loaded.values()) { drawHeatmap(it); drawLines(it); }
}

// ---- the runs ----

// `work(entry, it)` for each ticked model in turn until Stop, the model loaded with `weights`
// (its panel kept, or replaced for other weights) and drawn on the memory chart; the panels of
// unticked models go first.
async function eachModel(models, weights, work) {
  dropUnticked();
  for (const [i, entry] of models.entries()) {
    if (stopRequested) break;
    const it = await load(entry, weights, COLORS[i]);
    drawMemory();
    await work(entry, it);
  }
}

async function generate({ models, weights, prompt, tokens, temperature, topP, seed }) {
  await eachModel(models, weights, async (entry, it) => {
    const pre = it.panel.querySelector('pre.text');
    const progress = it.panel.querySelector('.progress');
    pre.textContent = prompt;
    it.columns = [];
    it.positions = [];
    const started = performance.now();
    const promptTokens = it.model.encode(prompt).length;
    let n = 0;
    status(`${entry.name}: generating…`);
    await it.model.generate(prompt, tokens, temperature, topP, seed, (piece, id, norms) => {
      n += 1;
      pre.textContent += piece;
      if (norms.length) it.columns.push(norms);
      it.positions.push(promptTokens + n - 1);
      const s = (performance.now() - started) / 1000;
      progress.textContent = `token ${n}/${tokens} · ${(n / s).toFixed(1)} tokens/s · ${s.toFixed(1)} s`;
      drawHeatmap(it);
      drawLines(it);
      return !stopRequested;
    });
    progress.dataset.tokens = n;
    redrawAll();
  });
  return `${models.map((m) => m.name).join(', ')} generated up to ${tokens} tokens each`;
}

// The needle grid: a row per haystack length, a column per depth; each cell the probe's
// verdict and what the model said. A length too short for the probe fails alone.
async function needles({ models, weights, lengths, depths }) {
  await eachModel(models, weights, async (entry, it) => {
    const box = it.panel.querySelector('.needles');
    box.textContent = '';
    const head = document.createElement('div');
    head.textContent = 'Needle probe: a 7-digit number hidden at each depth of filler text, then asked for (rows: tokens; columns: depth).';
    const table = document.createElement('table');
    table.className = 'grid';
    const top = table.insertRow();
    top.insertCell().textContent = 'tokens ↓ depth →';
    for (const d of depths) top.insertCell().textContent = `${d} %`;
    box.append(head, table);
    for (const n of lengths) {
      if (stopRequested) break;
      const row = table.insertRow();
      row.dataset.length = n;
      row.insertCell().textContent = String(n);
      for (const d of depths) {
        if (stopRequested) break;
        status(`${entry.name}: needle at ${d} % of ${n} tokens…`);
        try {
          const r = JSON.parse(await it.model.niah(n, d, 1));
          const cell = row.insertCell();
          Object.assign(cell.dataset, { length: n, depth: d, answer: r.answer, generated: r.generated });
          cell.className = r.correct ? 'hit' : 'miss';
          cell.textContent = r.correct ? `✓ ${r.answer}` : `✗ “${r.generated.trim()}” (was ${r.answer})`;
        } catch (e) {
          while (row.cells.length > 1) row.deleteCell(1);
          const cell = row.insertCell();
          cell.colSpan = depths.length;
          cell.className = 'bad';
          cell.dataset.length = n;
          cell.textContent = `not run — ${pageWords(e)}`;
          break;
        }
      }
    }
  });
  return 'needle probe done';
}

// ---- evaluation in the page: zero-shot tasks and perplexity, scored as `linearize eval` ----

function listTasks(tasks, saved) {
  const sel = $('task');
  sel.textContent = '';
  for (const t of tasks) sel.add(new Option(t, t));
  if (saved && tasks.includes(saved.task)) sel.value = saved.task;
}

// The task's request file, picked from disk or served by `linearize serve`, decompressed here.
async function requestFile(task) {
  if (!requestFiles.has(task)) {
    const file = pickedTasks.get(task);
    let body;
    if (file) {
      body = file.name.endsWith('.gz') ? file.stream().pipeThrough(new DecompressionStream('gzip')) : file.stream();
    } else {
      const r = await fetch(`eval/${task}.jsonl.gz`);
      if (!r.ok) throw new Error(`the request file of ${task}: HTTP ${r.status}`);
      body = r.body.pipeThrough(new DecompressionStream('gzip'));
    }
    requestFiles.set(task, await new Response(body).text());
  }
  return requestFiles.get(task);
}

// A line of a model's evaluation results, replacing the earlier one of the same key.
function evalLine(it, key, text, data) {
  const box = it.panel.querySelector('.evals');
  let line = box.querySelector(`[data-key="${key}"]`);
  if (!line) {
    line = document.createElement('div');
    line.dataset.key = key;
    box.append(line);
  }
  line.textContent = text;
  line.dataset.result = JSON.stringify(data);
}

async function zeroShot({ models, weights, task, docs }) {
  status(`${task}: fetching its request file…`);
  const jsonl = await requestFile(task);
  await eachModel(models, weights, async (entry, it) => {
    status(`${entry.name}: ${task} on ${docs} documents…`);
    const started = performance.now();
    const out = JSON.parse(await it.model.zero_shot(task, jsonl, docs));
    const r = out.result;
    const pm = (v, e) => `${v.toFixed(3)} ± ${(e || 0).toFixed(3)}`;
    const parts = [`acc ${pm(r.acc, r.acc_stderr)}`];
    if (r.acc_norm !== null) parts.push(`acc_norm ${pm(r.acc_norm, r.acc_norm_stderr)}`);
    if (r.perplexity !== null) parts.push(`perplexity ${r.perplexity.toFixed(2)}`);
    evalLine(it, task, `${task} (${r.docs} documents, 0-shot): ${parts.join(', ')} · ${((performance.now() - started) / 1000).toFixed(1)} s`, out);
  });
  return `${task} scored on ${docs} documents`;
}

async function perplexity({ models, weights, text }) {
  await eachModel(models, weights, async (entry, it) => {
    status(`${entry.name}: scoring the text…`);
    const r = JSON.parse(await it.model.perplexity(text));
    evalLine(it, 'perplexity', `perplexity of the pasted text: ${r.perplexity.toFixed(2)} over ${r.tokens} tokens`, r);
  });
  return 'text scored';
}

// ---- distil one block live: stage 1 of the paper's distillation in the browser ----

async function distilLive({ teacher, mixer, layer, steps, lr, text }) {
  const { files } = await modelFiles(entries.get(teacher));
  status(`${teacher}: the teacher reads the text; block ${layer}'s attention becomes a ${mixer} block…`);
  let fit;
  try {
    fit = await gpu.fit_mixer(files, mixer, layer, text, lr);
  } catch (e) {
    throw new Error(`The live fit could not start: ${pageWords(e)}`);
  }
  const points = [];
  const started = performance.now();
  const title = `${mixer} in block ${layer} of ${teacher} · ${fit.tokens()} tokens · learning rate ${lr}`;
  try {
    for (let s = 1; s <= steps && !stopRequested; s++) {
      status(`${mixer}, block ${layer}: step ${s} of ${steps}…`);
      points.push(JSON.parse(await fit.step()));
      const r = points[points.length - 1];
      const secs = (performance.now() - started) / 1000;
      $('fitprogress').textContent = `step ${r.step}/${steps} · loss ${r.loss.toExponential(3)} · ‖y − a‖/‖a‖ ${r.relative_error.toFixed(3)} · ${(r.step / secs).toFixed(2)} steps/s · ${secs.toFixed(1)} s`;
      drawFit(points, steps, title);
    }
  } finally {
    fit.free();
  }
  const first = points[0].loss.toExponential(3);
  const last = points[points.length - 1].loss.toExponential(3);
  return `${mixer} block ${layer} fitted for ${points.length} steps: loss ${first} → ${last}`;
}

// The fit's loss (left axis, from 0) and relative error ‖y − a‖/‖a‖ (right axis, 0–1) per step.
function drawFit(points, steps, title) {
  const c = $('fitchart');
  const g = c.getContext('2d');
  const [w, h, left, right, top, bottom] = [c.width, c.height, 70, 60, 24, 34];
  g.clearRect(0, 0, w, h);
  g.font = '12px sans-serif';
  g.fillStyle = '#333';
  g.fillText(title, left, 15);
  const maxLoss = Math.max(...points.map((p) => p.loss)) * 1.05;
  const x = (step) => left + (w - left - right) * (steps <= 1 ? 0 : (step - 1) / (steps - 1));
  const yLoss = (v) => top + (h - top - bottom) * (1 - v / maxLoss);
  const yRel = (v) => top + (h - top - bottom) * (1 - Math.min(v, 1));
  g.strokeStyle = '#999';
  g.strokeRect(left, top, w - left - right, h - top - bottom);
  g.textAlign = 'right';
  for (const f of [0, 0.5, 1]) g.fillText((maxLoss * f).toExponential(1), left - 4, yLoss(maxLoss * f) + 4);
  g.textAlign = 'left';
  for (const f of [0, 0.5, 1]) g.fillText(f.toFixed(1), w - right + 4, yRel(f) + 4);
  g.textAlign = 'center';
  for (const s of [1, Math.ceil(steps / 2), steps]) g.fillText(String(s), x(s), h - bottom + 14);
  g.fillText('step', (left + w - right) / 2, h - 4);
  g.textAlign = 'left';
  const line = (color, y, key) => {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    points.forEach((p, i) => (i === 0 ? g.moveTo(x(p.step), y(p[key])) : g.lineTo(x(p.step), y(p[key]))));
    g.stroke();
    g.lineWidth = 1;
  };
  line(COLORS[0], yLoss, 'loss');
  line(COLORS[1], yRel, 'relative_error');
  // The legend low on the left, where the lines have not yet come down to.
  g.fillStyle = COLORS[0];
  g.fillText('loss (mean squared error, left axis)', left + 8, h - bottom - 22);
  g.fillStyle = COLORS[1];
  g.fillText('‖y − a‖ / ‖a‖ (right axis)', left + 8, h - bottom - 8);
  c.dataset.points = points.length;
  c.dataset.losses = JSON.stringify(points.map((p) => p.loss));
}

// What `linearize serve` lists (models.json); none, and served false, where the page is
// static files (no such file, or a server that answers with something else).
async function servedModels() {
  try {
    const r = await fetch('models.json');
    if (r.ok) return { ...(await r.json()), served: true };
  } catch (_) { /* not served by linearize */ }
  return { models: [], tasks: [], served: false };
}

async function main() {
  restoreInputs(savedInputs());
  if (!navigator.gpu) {
    status('This browser has no WebGPU (navigator.gpu is missing). Use a recent Chrome or Edge, or Firefox with WebGPU enabled; nothing can run here without it.', 'nowebgpu');
    return;
  }
  await init();
  try {
    gpu = await WebGpu.create();
  } catch (e) {
    status(`WebGPU is present but no adapter could be used: ${pageWords(e)}`, 'nowebgpu');
    return;
  }
  const list = await servedModels();
  const saved = savedInputs();
  listModels(list.models, saved, list.served);
  $('pickdir').addEventListener('change', (e) => pickModel(e.target));
  $('pickfiles').addEventListener('change', (e) => pickModel(e.target));
  requestPaths = JSON.parse(request_files_json());
  for (const m of JSON.parse(mixer_names_json())) $('fitmixer').add(new Option(m, m));
  if (saved && typeof saved.fitmixer === 'string') $('fitmixer').value = saved.fitmixer;
  for (const id of ['fitmixer', 'fitlayer', 'fitsteps', 'fitlr']) $(id).addEventListener('change', saveInputs);
  $('fit').addEventListener('click', run('fit', distilLive));
  $('picktask').addEventListener('change', (e) => pickTasks(e.target, false));
  $('pickeval').addEventListener('change', (e) => pickTasks(e.target, true));
  for (const id of ['prompt', 'tokens', 'temperature', 'topp', 'seed', 'lengths', 'depths', 'docs', 'task', 'weights']) $(id).addEventListener('change', saveInputs);
  listTasks(list.tasks || [], saved);
  $('shared').addEventListener('change', () => { saveInputs(); redrawAll(); });
  $('run').addEventListener('click', run('generate', generate));
  $('needle').addEventListener('click', run('needles', needles));
  $('evaluate').addEventListener('click', run('zeroshot', zeroShot));
  $('score').addEventListener('click', run('perplexity', perplexity));
  $('stop').addEventListener('click', () => { stopRequested = true; status('stopping after the current token…'); });
  setBusy(false);
  const adapter = JSON.parse(gpu.adapter_json());
  const name = adapter.name || 'an unnamed adapter';
  $('adapter').textContent = `WebGPU adapter: ${name} (${adapter.device_type || 'unknown type'})`
    + (adapter.device_type === 'Cpu' ? ' — a software adapter: expect seconds per token, not milliseconds.' : '');
  drawMemory();
  status(list.served ? `ready on ${name}` : `ready on ${name}: static page, no server — pick a model from disk`, 'ready');
}

main().catch((e) => status(pageWords(e), 'error'));
