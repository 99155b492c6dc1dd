// Starts what the console tests need: the mock upstream and the gateway (both from the aigw
// binary built beforehand: target/debug/aigw, or $AIGW_BIN), with a fresh SQLite database and a
// resources file, and Debian's chromium driven by playwright-core. Nothing here builds anything.

import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, createWriteStream, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startIdp, SSO_CLIENT } from './oidc.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '..', '..');
export const outDir = path.join(repo, 'test-output', 'console');

export const OWNER = { email: 'owner@acme.test', password: 'owner-pass-123' };
export const ADA = { email: 'ada@acme.test', password: 'ada-pass-1234' };
export const ADA_KEY = 'sk-aigw-AdaFixedKey0123456789abcdefghijk';
export const OWNER_KEY = 'sk-aigw-OwnerOpsKey0123456789abcdefghijk';
export const FLAKY_KEY = 'sk-aigw-FlakyAppKey0123456789abcdefghijk';
export const PRIMARY_SECRET = 'cred-primary';

/** A free TCP port on 127.0.0.1 (closed again before it is used: good enough for tests). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function aigwBin() {
  const bin = process.env.AIGW_BIN || path.join(repo, 'target', 'debug', 'aigw');
  if (!existsSync(bin)) throw new Error(`no gateway binary at ${bin}: run \`cargo build\` first or set AIGW_BIN`);
  return bin;
}

function startProcess(name, args, env) {
  mkdirSync(outDir, { recursive: true });
  const log = createWriteStream(path.join(outDir, `${name}.log`));
  const child = spawn(aigwBin(), args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout.pipe(log);
  child.stderr.pipe(log);
  return child;
}

function stop(child) {
  return new Promise((resolve) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) { resolve(); return; }
    const timer = setTimeout(() => { child.kill('SIGKILL'); }, 5000);
    child.once('exit', () => { clearTimeout(timer); resolve(); });
    child.kill('SIGTERM');
  });
}

/** `aigw mock-upstream --listen 127.0.0.1:0`; resolves with its base address once it prints it. */
async function startMock() {
  const child = startProcess('mock-upstream', ['mock-upstream', '--listen', '127.0.0.1:0'], {});
  const addr = await new Promise((resolve, reject) => {
    let buf = '';
    const timer = setTimeout(() => reject(new Error(`the mock upstream did not start: ${buf}`)), 15000);
    child.stdout.on('data', (d) => {
      buf += d;
      const m = /mock upstream on (\S+)/.exec(buf);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.once('exit', (code) => reject(new Error(`the mock upstream exited (${code}): ${buf}`)));
  });
  return { child, url: `http://${addr}` };
}

function resources(mockUrl) {
  return `
[[workspace]]
name = "acme"

[[department]]
workspace = "acme"
name = "research"

[[member]]
workspace = "acme"
email = "${OWNER.email}"
role = "owner"
password = "${OWNER.password}"

[[member]]
workspace = "acme"
department = "research"
email = "${ADA.email}"
role = "member"
password = "${ADA.password}"

[[api_key]]
member = "${ADA.email}"
name = "ci"
key = "${ADA_KEY}"

[[api_key]]
member = "${OWNER.email}"
name = "ops"
key = "${OWNER_KEY}"

[[api_key]]
member = "${OWNER.email}"
name = "flaky"
key = "${FLAKY_KEY}"

[[upstream]]
workspace = "acme"
name = "primary"
provider = "openai-compatible"
base_url = "${mockUrl}/v1"
api_key = "${PRIMARY_SECRET}"
models = ["gpt-4o-mini", { name = "fast", upstream = "gpt-4o-mini" }]
priority = 0
limits = { requests_per_minute = 600 }

[[upstream]]
workspace = "acme"
name = "claude"
provider = "anthropic"
base_url = "${mockUrl}/v1"
api_key = "cred-claude"
models = ["claude-sonnet"]
quota_group = "anthropic-account"

[[model]]
workspace = "acme"
name = "gpt-4o-mini"
fallbacks = ["fast"]
price = { prompt = 0.15, completion = 0.60 }

[[model]]
workspace = "acme"
name = "fast"
price = { prompt = 0.15, completion = 0.60 }

[[model]]
workspace = "acme"
name = "claude-sonnet"
price = { prompt = 3.0, completion = 15.0 }
`;
}

async function waitReady(base, child) {
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the gateway exited with ${child.exitCode}; see ${outDir}/gateway.log`);
    try {
      const r = await fetch(`${base}/readyz`);
      if (r.ok) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`the gateway was not ready within 60 s; see ${outDir}/gateway.log`);
}

export const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage',
];

/** Starts the mock, the gateway and the browser; returns handles and a stop(). */
export async function startStack() {
  const executablePath = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
  // Checked before anything starts: a gateway left running would keep node from ever exiting.
  if (!existsSync(executablePath)) {
    throw new Error(`no browser at ${executablePath}: apt-get install chromium, or set CHROMIUM_BIN`);
  }
  mkdirSync(outDir, { recursive: true });
  const tmp = mkdtempSync(path.join(tmpdir(), 'aigw-console-'));
  const mock = await startMock();
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const idp = await startIdp(await freePort(), `${base}/admin/v1/auth/oidc/callback`);
  const resPath = path.join(tmp, 'resources.toml');
  writeFileSync(resPath, resources(mock.url));
  const gateway = startProcess('gateway', ['serve', '--resources', resPath], {
    AIGW_DATABASE_URL: `sqlite://${tmp}/aigw.db`,
    AIGW_LISTEN: `127.0.0.1:${port}`,
    AIGW_BOOTSTRAP_EMAIL: OWNER.email,
    AIGW_BOOTSTRAP_PASSWORD: OWNER.password,
    AIGW_OIDC_ISSUER: idp.issuer,
    AIGW_OIDC_CLIENT_ID: SSO_CLIENT.id,
    AIGW_OIDC_CLIENT_SECRET: SSO_CLIENT.secret,
    AIGW_OIDC_REDIRECT_URL: `${base}/admin/v1/auth/oidc/callback`,
    AIGW_OIDC_SCOPES: 'openid email groups',
    AIGW_OIDC_GROUPS: 'aigw-admins=acme:admin',
    // The budget-alert test's webhook receiver is on loopback.
    AIGW_ALERT_WEBHOOK_ALLOW: '127.0.0.1',
  });
  try {
    await waitReady(base, gateway);
  } catch (e) {
    await stop(gateway); await stop(mock.child); await idp.close();
    throw e;
  }
  let browser;
  try {
    browser = await chromium.launch({ executablePath, headless: true, args: CHROMIUM_ARGS });
  } catch (e) {
    await stop(gateway); await stop(mock.child); await idp.close();
    throw e;
  }
  return {
    base,
    mockUrl: mock.url,
    idp: idp.issuer,
    browser,
    async stop() {
      await browser.close().catch(() => {});
      await stop(gateway);
      await stop(mock.child);
      await idp.close();
      rmSync(tmp, { recursive: true, force: true });
    },
  };
}

/**
 * A new page with its guards: every request must go to the gateway (or be data:/blob:), and
 * no uncaught page error may happen. `problems` collects what went wrong.
 */
export async function openPage(stack, { width = 1280, height = 800, problems, also = [] }) {
  const context = await stack.browser.newContext({
    viewport: { width, height },
    acceptDownloads: true,
    baseURL: stack.base,
  });
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: stack.base });
  const page = await context.newPage();
  const origin = new URL(stack.base).origin;
  page.on('request', (req) => {
    const u = req.url();
    if (u.startsWith('data:') || u.startsWith('blob:')) return;
    if (new URL(u).origin !== origin && !also.includes(new URL(u).origin)) {
      problems.push(`request to another host: ${req.method()} ${u}`);
    }
  });
  page.on('pageerror', (err) => problems.push(`uncaught page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error' && !/Failed to load resource: the server responded with a status of (4\d\d)/.test(msg.text())) {
      problems.push(`console error: ${msg.text()}`);
    }
  });
  return { context, page };
}

/** A proxied chat completion with a gateway key, from node. */
export async function chat(stack, key, model = 'gpt-4o-mini') {
  const r = await fetch(`${stack.base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hello from the console test' }] }),
  });
  const body = await r.json().catch(() => null);
  return { status: r.status, body, headers: r.headers };
}

/** A proxied Anthropic-format message (to anthropic credentials), from node. */
export async function anthropicMessage(stack, key, model = 'claude-sonnet') {
  const r = await fetch(`${stack.base}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model, max_tokens: 16, messages: [{ role: 'user', content: 'hello from the console test' }] }),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
}

/** Adds a script to the mock upstream. */
export async function mockScript(stack, script) {
  const r = await fetch(`${stack.mockUrl}/__mock/script`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(script),
  });
  if (!r.ok) throw new Error(`mock script refused: ${r.status} ${await r.text()}`);
}

export async function mockCalls(stack) {
  return (await fetch(`${stack.mockUrl}/__mock/calls`)).json();
}

export async function signIn(page, who) {
  await page.goto('/console/');
  await page.getByLabel('Email').fill(who.email);
  await page.getByLabel('Password').fill(who.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'My quota' }).waitFor();
}

export async function shot(page, name) {
  await page.screenshot({ path: path.join(outDir, `${name}.png`), fullPage: true });
}
