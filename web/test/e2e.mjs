// Drives the built page (web/dist, served on 127.0.0.1) in headless Chromium with WebGPU on
// SwiftShader: loads the built-in model, generates greedy tokens for a fixed prompt through
// the page's own controls, compares them with the native binary's tokens, takes a
// screenshot. Also checks the message a browser without WebGPU gets.
//
// env: SPARSA_URL (page), SPARSA_PROMPT, SPARSA_EXPECTED (comma-separated native ids),
//      SPARSA_MAX_TOKENS, SPARSA_SCREENSHOT (png path), SPARSA_LIMITS ("default" | "adapter"),
//      CHROMIUM (default /usr/bin/chromium)
import { chromium } from 'playwright-core';

const url = process.env.SPARSA_URL;
const prompt = process.env.SPARSA_PROMPT;
const expected = process.env.SPARSA_EXPECTED;
// A prompt longer than the model's top-k with the smallest caches (FP8 latent rows, int8
// rotated keys), so that the indexer scores int8 keys.
const expectedCompact = process.env.SPARSA_EXPECTED_COMPACT;
const compactPrompt = process.env.SPARSA_COMPACT_PROMPT;
const compactTokens = process.env.SPARSA_COMPACT_TOKENS || '8';
const maxTokens = process.env.SPARSA_MAX_TOKENS || '32';
const shot = process.env.SPARSA_SCREENSHOT;
const limits = process.env.SPARSA_LIMITS || 'default';
const exe = process.env.CHROMIUM || '/usr/bin/chromium';

const common = ['--no-sandbox', '--disable-gpu-sandbox', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'];
const webgpu = ['--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'];

function fail(msg) {
  console.error(`e2e: FAIL: ${msg}`);
  process.exit(1);
}

async function withPage(args, fn) {
  const browser = await chromium.launch({ executablePath: exe, headless: true, args });
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 1000 } });
    page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
    page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
    return await fn(page);
  } finally {
    await browser.close();
  }
}

// 1. The page with WebGPU: load, generate, compare.
const got = await withPage([...common, ...webgpu], async (page) => {
  const t0 = Date.now();
  await page.goto(`${url}?limits=${limits}`);
  // The built-in model loads by default; wait for it (or for an error).
  await page.waitForFunction(() => document.body.dataset.ready || !document.getElementById('error').hidden,
    null, { timeout: 180_000 });
  const err = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
  if (err) fail(`the page shows an error while loading: ${err}`);
  console.log(`e2e: model loaded in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  console.log(`e2e: adapter: ${await page.textContent('#adapter-name')}`);
  const table = await page.$$eval('#limits tr', (rows) => rows.map((r) => r.innerText.replace(/\t/g, ' | ')));
  console.log(`e2e: limits:\n  ${table.join('\n  ')}`);
  console.log(`e2e: ${await page.textContent('#model-info')}`);

  // Complete the fixed prompt, greedy, through the page's controls.
  await page.selectOption('#mode', 'complete');
  await page.fill('#max-tokens', maxTokens);
  await page.fill('#temperature', '0');
  await page.fill('#repeat-penalty', '1');
  await page.click('#prompt');
  await page.keyboard.type(prompt); // one line: Enter would submit
  if ((await page.inputValue('#prompt')) !== prompt) fail('the prompt box does not hold the typed prompt');
  const t1 = Date.now();
  await page.click('#generate');
  await page.waitForFunction(() => document.getElementById('output').dataset.done === 'true',
    null, { timeout: 900_000 });
  const gen = (Date.now() - t1) / 1000;
  const err2 = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
  if (err2) fail(`the page shows an error while generating: ${err2}`);
  const ids = await page.$eval('#output', (e) => e.dataset.tokenIds);
  const text = await page.textContent('#output');
  const stats = await page.textContent('#stats');
  console.log(`e2e: generated in ${gen.toFixed(1)} s: ${stats}`);
  console.log(`e2e: text: ${JSON.stringify(text)}`);
  if (shot) {
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`e2e: screenshot ${shot}`);
  }

  // The compact caches: FP8 latent rows and int8 keys through Tint/WebGPU, same tokens as
  // the native binary with --cache-type fp8/i8.
  if (expectedCompact) {
    await page.fill('#prompt', compactPrompt);
    await page.fill('#max-tokens', compactTokens);
    await page.selectOption('#cache-type', 'fp8/i8');
    await page.click('#generate');
    await page.waitForFunction(() => document.getElementById('output').dataset.done === 'true',
      null, { timeout: 900_000 });
    const errc = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
    if (errc) fail(`the page shows an error while generating with fp8/i8 caches: ${errc}`);
    const idsc = await page.$eval('#output', (e) => e.dataset.tokenIds);
    console.log(`e2e: fp8/i8 caches: ${idsc}`);
    if (idsc !== expectedCompact) fail(`fp8/i8 caches: the page's tokens ${idsc} differ from the native ${expectedCompact}`);
    console.log('e2e: fp8/i8 caches: the page generates the native tokens');
    await page.selectOption('#cache-type', 'auto');
  }

  // A short chat turn through the model's template (the chat path, not compared).
  await page.selectOption('#mode', 'chat');
  await page.fill('#max-tokens', '4');
  await page.fill('#prompt', 'Who art thou?');
  await page.click('#generate');
  await page.waitForFunction(() => document.getElementById('output').dataset.done === 'true',
    null, { timeout: 900_000 });
  const err3 = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
  if (err3) fail(`the page shows an error in chat mode: ${err3}`);
  const chatIds = await page.$eval('#output', (e) => e.dataset.tokenIds);
  const transcript = await page.textContent('#transcript');
  if (!chatIds || !transcript.includes('Who art thou?')) fail(`chat turn: ids ${chatIds}, transcript ${transcript}`);
  console.log(`e2e: chat turn: ids ${chatIds}, transcript ${JSON.stringify(transcript)}; ${await page.textContent('#stats')}`);
  return ids;
});

console.log(`e2e: browser ids: ${got}`);
console.log(`e2e: native  ids: ${expected}`);
if (!expected) fail('no native ids to compare with (SPARSA_EXPECTED)');
if (got !== expected) fail('the browser generated other tokens than the native binary');
console.log(`e2e: the ${got.split(',').length} tokens match the native binary`);

// 2. Without WebGPU the page says so (Chromium without --enable-unsafe-webgpu offers no adapter).
await withPage(common, async (page) => {
  await page.goto(url);
  await page.waitForFunction(() => !document.getElementById('error').hidden, null, { timeout: 60_000 });
  const msg = await page.textContent('#error');
  if (!/WebGPU/.test(msg)) fail(`without WebGPU the page says: ${msg}`);
  console.log(`e2e: without WebGPU the page says: ${msg}`);
});
console.log('e2e: PASS');
