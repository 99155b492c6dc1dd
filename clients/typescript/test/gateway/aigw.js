// Starts `aigw mock-upstream` and `aigw serve` (the binary from AIGW_BIN, default the repository's
// target/debug/aigw) on free ports with a fresh SQLite database and a resources file.
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
const BIN = process.env.AIGW_BIN ?? join(ROOT, 'target', 'debug', 'aigw');

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
    s.on('error', rej);
  });
}

async function waitReady(url, proc, what, log) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${what} exited early: ${readFileSync(log, 'utf8')}`);
    try {
      const r = await fetch(url);
      await r.body?.cancel();
      if (r.status < 500) return;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not start`);
}

/**
 * Starts both with `resources` (`{mock}` is replaced by the mock's port); returns their base URLs,
 * `script(rule)`, `mockCalls()` and `stop()`.
 */
export async function start(resources) {
  if (!existsSync(BIN)) throw new Error(`build the gateway first (cargo build): ${BIN} is missing`);
  const tmp = mkdtempSync(join(tmpdir(), 'aigw-ts-'));
  const [mockPort, gwPort] = [await freePort(), await freePort()];
  const mockLog = join(tmp, 'mock.log');
  const gwLog = join(tmp, 'aigw.log');
  const mock = spawn(BIN, ['mock-upstream', '--listen', `127.0.0.1:${mockPort}`], { stdio: ['ignore', 'ignore', openSync(mockLog, 'w')] });
  const res = join(tmp, 'resources.toml');
  writeFileSync(res, resources.replaceAll('{mock}', String(mockPort)));
  const env = { PATH: process.env.PATH, AIGW_LISTEN: `127.0.0.1:${gwPort}`, AIGW_DATABASE_URL: `sqlite://${tmp}/aigw.db`,
    AIGW_BOOTSTRAP_PASSWORD: 'clients-owner-pass', AIGW_LOG: 'warn' };
  const gw = spawn(BIN, ['serve', '--resources', res], { env, cwd: tmp, stdio: ['ignore', 'ignore', openSync(gwLog, 'w')] });
  const stop = async () => {
    for (const p of [gw, mock]) {
      if (p.exitCode === null) {
        const exited = new Promise((r) => p.once('exit', r));
        p.kill('SIGTERM');
        await exited;
      }
    }
  };
  try {
    await waitReady(`http://127.0.0.1:${mockPort}/__mock/calls`, mock, 'mock upstream', mockLog);
    await waitReady(`http://127.0.0.1:${gwPort}/readyz`, gw, 'aigw', gwLog);
  } catch (e) {
    await stop();
    throw e;
  }
  const mockUrl = `http://127.0.0.1:${mockPort}`;
  return {
    gw: `http://127.0.0.1:${gwPort}`,
    mock: mockUrl,
    async script(rule) {
      const r = await fetch(`${mockUrl}/__mock/script`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(rule) });
      if (!r.ok) throw new Error(`script refused: ${await r.text()}`);
    },
    async mockCalls() {
      return (await fetch(`${mockUrl}/__mock/calls`)).json();
    },
    stop,
  };
}
