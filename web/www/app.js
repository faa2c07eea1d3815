// The sparsa demo page: loads a model directory over HTTP (or from local files) into the
// wasm engine, shows the adapter and its limits, then streams chat replies or completions.
//
// URL parameters: ?model=URL (a model directory, default "model/": the built-in model copied
// beside the page), ?limits=default (WebGPU's default limits only), ?autoload=0.
import init, { open } from './pkg/sparsa_web.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

let engine = null;      // the wasm Engine, once a model is loaded
let generating = false;
let stopRequested = false;

function status(text) { $('status').textContent = text; }

function showError(e) {
  const msg = (e && e.message) ? e.message : String(e);
  const box = $('error');
  box.textContent = msg;
  box.hidden = false;
  console.error(e);
}

function clearError() { $('error').hidden = true; $('error').textContent = ''; }

const mb = (n) => (n / 1e6).toFixed(1) + ' MB';

// Fetch one file with progress. Optional files that are missing (404) give null.
async function fetchFile(url, optional, onProgress) {
  let resp;
  try {
    resp = await fetch(url);
  } catch (e) {
    throw new Error(`${url}: cannot fetch (${e.message})`);
  }
  if (!resp.ok) {
    if (optional && resp.status === 404) return null;
    throw new Error(`${url}: HTTP ${resp.status} ${resp.statusText}`);
  }
  const total = Number(resp.headers.get('content-length')) || 0;
  if (!resp.body) return new Uint8Array(await resp.arrayBuffer());
  const reader = resp.body.getReader();
  const chunks = [];
  let done = 0;
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    chunks.push(value);
    done += value.length;
    onProgress(done, total);
  }
  const out = new Uint8Array(done);
  let at = 0;
  for (const c of chunks) { out.set(c, at); at += c.length; }
  return out;
}

function progress(done, total, text) {
  const p = $('progress');
  p.hidden = false;
  p.max = total || 1;
  p.value = total ? done : 0;
  $('progress-text').textContent = text;
}

// The files of a model directory at `base`: config.json and friends, then the weights
// (model.safetensors, or the shards named by model.safetensors.index.json).
async function downloadModel(base) {
  if (!base.endsWith('/')) base += '/';
  const files = [];
  const t0 = performance.now();
  let bytes = 0;
  const get = async (name, optional) => {
    const data = await fetchFile(new URL(name, new URL(base, location.href)).href, optional, (d, t) => {
      const s = (performance.now() - t0) / 1000;
      progress(d, t, `downloading ${name}: ${mb(d)}${t ? ' / ' + mb(t) : ''} (${mb((bytes + d) / Math.max(s, 1e-3))}/s)`);
    });
    if (data) { files.push([name, data]); bytes += data.length; }
    return data;
  };
  await get('config.json', false);
  for (const n of ['generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja']) {
    await get(n, true);
  }
  const index = await get('model.safetensors.index.json', true);
  let weights = ['model.safetensors'];
  if (index) {
    let map;
    try {
      map = JSON.parse(new TextDecoder().decode(index)).weight_map;
    } catch (e) {
      throw new Error(`${base}model.safetensors.index.json: not valid JSON (${e.message})`);
    }
    if (!map || typeof map !== 'object') throw new Error(`${base}model.safetensors.index.json: no weight_map`);
    weights = [...new Set(Object.values(map))].sort();
  }
  for (const w of weights) await get(w, false);
  const s = (performance.now() - t0) / 1000;
  progress(1, 1, `downloaded ${files.length} files, ${mb(bytes)} in ${s.toFixed(2)} s`);
  return files;
}

async function readLocalFiles(fileList) {
  const files = [];
  const list = [...fileList];
  let i = 0;
  for (const f of list) {
    i += 1;
    progress(i - 1, list.length, `reading ${f.name} (${i}/${list.length})`);
    if (f.name.endsWith('.json') || f.name.endsWith('.safetensors') || f.name.endsWith('.jinja')) {
      files.push([f.name, new Uint8Array(await f.arrayBuffer())]);
    }
  }
  progress(1, 1, `read ${files.length} files`);
  return files;
}

// wgpu reports no adapter name in the browser: ask WebGPU for its description.
async function adapterName(info) {
  if (info.name) return info.name;
  try {
    const a = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
    const i = a && a.info;
    if (i) return [i.vendor, i.architecture, i.description].filter((x) => x).join(' / ') || 'WebGPU adapter';
  } catch (_) { /* the name is only shown */ }
  return 'WebGPU adapter';
}

async function showAdapter(info) {
  $('adapter-box').hidden = false;
  $('adapter-name').textContent = `${await adapterName(info)} (${info.backend}, ${info.device_type})${info.driver ? ' — ' + info.driver : ''}`;
  const rows = [
    ['max storage buffer binding', info.adapter.max_storage_buffer_binding_size, info.device.max_storage_buffer_binding_size, mib],
    ['max buffer size', info.adapter.max_buffer_size, info.device.max_buffer_size, mib],
    ['invocations per workgroup', info.adapter.max_compute_invocations_per_workgroup, info.device.max_compute_invocations_per_workgroup],
    ['storage buffers per stage', info.adapter.max_storage_buffers_per_shader_stage, info.device.max_storage_buffers_per_shader_stage],
    ['workgroup memory', info.adapter.max_compute_workgroup_storage_size, info.device.max_compute_workgroup_storage_size, kib],
    ['shader-f16', yes(info.adapter.shader_f16), 'not used'],
    ['subgroups (via wgpu)', yes(info.adapter.subgroups), 'not used'],
  ];
  const t = $('limits');
  t.innerHTML = '<tr><th></th><th>adapter offers</th><th>device requested</th></tr>';
  for (const [name, a, d, f] of rows) {
    const tr = document.createElement('tr');
    for (const v of [name, f ? f(a) : a, f ? f(d) : d]) {
      const td = document.createElement('td');
      td.textContent = v;
      tr.appendChild(td);
    }
    t.appendChild(tr);
  }
}
function mib(n) { return `${Math.round(n / 1048576)} MiB`; }
function kib(n) { return `${Math.round(n / 1024)} KiB`; }
function yes(b) { return b ? 'yes' : 'no'; }

async function loadModel(label, filesPromise) {
  if (generating) return;
  clearError();
  $('chat-box').hidden = true;
  $('model-info').textContent = '';
  if (engine) { engine.destroy(); engine.free(); engine = null; }
  try {
    const defaultLimits = $('default-limits').checked;
    status('Opening the WebGPU adapter…');
    const e = await open(defaultLimits);
    await showAdapter(JSON.parse(e.adapter()));
    status(`Downloading ${label}…`);
    const files = await filesPromise();
    status('Uploading the weights to the GPU…');
    await new Promise((r) => setTimeout(r, 0)); // let the status paint
    for (const [name, data] of files) e.add_file(name, data);
    const t0 = performance.now();
    const info = JSON.parse(e.load_model(label));
    const s = (performance.now() - t0) / 1000;
    engine = e;
    $('model-info').textContent =
      `${info.label}: ${info.model_type}, ${info.layers} layers, hidden ${info.hidden_size}, vocab ${info.vocab_size}, ` +
      `top-${info.index_topk} sparse attention; weights ${mb(info.weight_bytes)} on the GPU in ${s.toFixed(2)} s; ` +
      `chat context ${info.chat_ctx} tokens; template: ${info.template}`;
    $('chat-box').hidden = false;
    document.body.dataset.ready = 'true';
    status(`Ready: ${info.label}`);
  } catch (err) {
    status('Loading failed.');
    showError(err);
  }
}

function options() {
  const num = (id) => Number($(id).value);
  return {
    max_tokens: num('max-tokens'),
    temperature: num('temperature'),
    top_p: num('top-p'),
    top_k: num('top-k'),
    seed: num('seed'),
    repeat_penalty: num('repeat-penalty'),
    system: $('system').value,
    cache_type: $('cache-type').value,
  };
}

function setBusy(on) {
  generating = on;
  $('generate').disabled = on;
  $('reset').disabled = on;
  $('load-url').disabled = on;
  $('stop').disabled = !on;
}

async function run() {
  if (!engine || generating) return;
  clearError();
  const mode = $('mode').value;
  const text = $('prompt').value;
  if (!text.trim()) { showError('Type a prompt first.'); return; }
  const out = $('output');
  out.dataset.done = 'false';
  out.dataset.tokenIds = '';
  const ids = [];
  let tFirst = 0, tLast = 0, promptTokens = 0;
  const t0 = performance.now();
  let target;   // where the streamed text goes
  if (mode === 'complete') {
    out.textContent = '';
    const p = document.createElement('span');
    p.className = 'prompt';
    p.textContent = text;
    out.appendChild(p);
    target = out;
  } else {
    out.textContent = '';
    const u = document.createElement('div');
    u.className = 'msg user';
    u.textContent = text.trim();
    $('transcript').appendChild(u);
    target = document.createElement('div');
    target.className = 'msg model';
    $('transcript').appendChild(target);
    $('prompt').value = '';
  }
  let reasoning = null;
  const onEvent = (kind, a, b) => {
    const now = performance.now();
    if (kind === 'prefill') {
      promptTokens = b;
      stats(`prefill ${a}/${b} tokens…`);
    } else if (kind === 'token') {
      ids.push(a);
      if (ids.length === 1) tFirst = now;
      tLast = now;
      if (mode === 'complete') target.appendChild(document.createTextNode(b));
      const decode = ids.length > 1 ? (ids.length - 1) / ((tLast - tFirst) / 1000) : 0;
      stats(`${ids.length} tokens, ${rate(decode)} tok/s`);
    } else if (kind === 'text') {
      if (a === 'reasoning') {
        if (!reasoning) {
          reasoning = document.createElement('span');
          reasoning.className = 'reasoning';
          target.appendChild(reasoning);
        }
        reasoning.appendChild(document.createTextNode(b));
      } else {
        target.appendChild(document.createTextNode(b));
      }
    }
    return !stopRequested;
  };
  stopRequested = false;
  setBusy(true);
  status(mode === 'complete' ? 'Completing…' : 'Replying…');
  try {
    const r = JSON.parse(mode === 'complete'
      ? await engine.complete(text, options(), onEvent)
      : await engine.chat(text, options(), onEvent));
    const total = (performance.now() - t0) / 1000;
    const ttft = ids.length ? (tFirst - t0) / 1000 : total;
    const decode = ids.length > 1 ? (ids.length - 1) / ((tLast - tFirst) / 1000) : 0;
    const n = r.prompt_tokens ?? promptTokens;
    const prefilled = r.prefilled ?? n;
    stats(`prompt ${n} tokens` + (r.reused ? ` (${r.reused} reused from the cache)` : '') +
      `, prefill ${rate(prefilled / Math.max(ttft, 1e-3))} tok/s (first token ${ttft.toFixed(2)} s)` +
      ` | ${ids.length} tokens, decode ${rate(decode)} tok/s | ended: ${r.stop ?? r.end}` +
      (r.dropped_turns ? ` | dropped ${r.dropped_turns} old turns` : '') +
      (r.ctx ? ` | context ${r.context_used}/${r.ctx}` : ''));
    out.dataset.tokenIds = ids.join(',');
    out.dataset.decodeTokS = decode.toFixed(2);
    out.dataset.stop = r.stop ?? r.end;
    status('Ready.');
  } catch (err) {
    status('Generation failed.');
    showError(err);
  } finally {
    out.dataset.done = 'true';
    setBusy(false);
  }
}

function stats(text) { $('stats').textContent = text; }

// Rates below 10 tok/s with two digits (software adapters are slow).
function rate(x) { return x < 10 ? x.toFixed(2) : x.toFixed(1); }

async function main() {
  $('default-limits').checked = params.get('limits') === 'default';
  if (params.get('model')) $('model-url').value = params.get('model');
  if (!navigator.gpu) {
    status('No WebGPU.');
    showError('This browser has no WebGPU (navigator.gpu is missing). sparsa needs WebGPU: ' +
      'use a recent Chrome, Edge or Chromium (or Firefox/Safari with WebGPU enabled), ' +
      'served over https or from localhost.');
    document.body.dataset.ready = 'no-webgpu';
    return;
  }
  try {
    status('Loading the WebAssembly module…');
    await init();
  } catch (err) {
    status('The WebAssembly module failed to load.');
    showError(err);
    return;
  }
  $('model-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const url = $('model-url').value.trim() || 'model/';
    loadModel(url, () => downloadModel(url));
  });
  $('model-files').addEventListener('change', (ev) => {
    const list = ev.target.files;
    if (!list || !list.length) return;
    const first = list[0].webkitRelativePath || list[0].name;
    const label = first.includes('/') ? first.split('/')[0] : 'local files';
    loadModel(label, () => readLocalFiles(list));
  });
  $('prompt-form').addEventListener('submit', (ev) => { ev.preventDefault(); run(); });
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); run(); }
  });
  $('stop').addEventListener('click', () => { stopRequested = true; });
  $('reset').addEventListener('click', () => {
    if (!engine) return;
    try { engine.reset_chat(); } catch (err) { showError(err); return; }
    $('transcript').textContent = '';
    $('output').textContent = '';
    stats('');
  });
  $('mode').addEventListener('change', () => {
    const chat = $('mode').value === 'chat';
    $('generate').textContent = chat ? 'Send' : 'Generate';
    $('reset').hidden = !chat;
  });
  if (params.get('autoload') !== '0') {
    const url = $('model-url').value.trim() || 'model/';
    loadModel(url === 'model/' ? 'sparsa-bard-12m (served beside the page)' : url, () => downloadModel(url));
  } else {
    status('Choose a model.');
  }
}

main();
