// pacedFetch against a simulated gateway, on virtual time, alone and under the openai SDK.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Pacer, pacedFetch, retryAt } from '../../src/index.js';
import { SimGateway, T0, VirtualTime, chat, error, rfc3339 } from '../fakes.js';

function setup(vt, gw, settings = {}, inner = gw.fetch) {
  const pacer = new Pacer(settings, { clock: vt.clock, wall: vt.wall, random: () => 0.5 });
  return pacedFetch({ pacer, fetch: inner, sleep: vt.sleep, wall: vt.wall });
}

const near = (got, want, eps = 1e-6) => assert.ok(Math.abs(got - want) < eps, `${got} vs ${want}`);

test('calls are spread over the window and never refused', async () => {
  const vt = new VirtualTime(T0 + 30);
  const gw = new SimGateway(vt, 10);
  const f = setup(vt, gw);
  const statuses = [];
  await vt.run((async () => {
    for (let i = 0; i < 15; i++) statuses.push((await chat(f)).status);
  })());
  assert.deepEqual(statuses, Array(15).fill(200));
  assert.equal(gw.quotaReads, 1);
  const times = gw.calls.map(([t]) => t);
  times.slice(0, 10).forEach((t, i) => near(t, 3 * i));
  times.slice(10).forEach((t, i) => near(t, 31 + 5.9 * i));
});

test('without the helper the same run is refused', async () => {
  const vt = new VirtualTime(T0 + 30);
  const gw = new SimGateway(vt, 10);
  const statuses = [];
  for (let i = 0; i < 15; i++) statuses.push((await chat(gw.fetch)).status);
  assert.equal(statuses.filter((s) => s === 429).length, 5);
});

test('concurrent calls share one schedule', async () => {
  const vt = new VirtualTime(T0 + 30);
  const gw = new SimGateway(vt, 10);
  const f = setup(vt, gw, { mostWait: 120 });
  const rs = await vt.run(...[...Array(25)].map(() => chat(f)));
  assert.deepEqual(rs.map((r) => r.status), Array(25).fill(200));
  const times = gw.calls.map(([t]) => t).sort((a, b) => a - b);
  times.slice(0, 10).forEach((t, i) => near(t, 3 * i));
  near(times[10], 31);
  near(times[20], 91);
});

test('calls that cannot wait are told when to come back, without a refusal from the gateway', async () => {
  const vt = new VirtualTime(T0 + 30);
  const gw = new SimGateway(vt, 10);
  const f = setup(vt, gw, { mostWait: 15 });
  const rs = await vt.run(...[...Array(25)].map(() => chat(f)));
  // The window's 10: paced within 15 s (0, 3, …, 15), the rest at once.
  assert.equal(rs.filter((r) => r.status === 200).length, 10);
  const times = gw.calls.map(([t]) => t).sort((a, b) => a - b);
  // (At once: as soon as the key's quotas are read, a poll of 0.05 s.)
  times.slice(0, 5).forEach((t) => assert.ok(t <= 0.05 + 1e-9, String(times)));
  [3, 6, 9, 12, 15].forEach((t, i) => near(times[5 + i], t));
  const told = rs.filter((r) => r.status === 429);
  for (const r of told) assert.equal((await r.json()).error.code, 'wait_too_long');
  assert.equal(gw.calls.filter(([, s]) => s === 429).length, 0);
});

test('a final refusal is passed on at once and closes the key', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10);
  gw.script.push([429, { 'x-should-retry': 'false', 'x-aigw-error-source': 'gateway' }, error('quota_exceeded', { reset_at: rfc3339(T0 + 150) })]);
  const f = setup(vt, gw);
  const [r] = await vt.run(chat(f));
  assert.equal(r.status, 429);
  assert.equal(gw.calls.length, 1);
  assert.equal(r.headers.get('x-should-retry'), 'false');
  assert.equal(retryAt(r), T0 + 150);
  const [again] = await vt.run(chat(f));
  assert.equal(gw.calls.length, 1, 'not sent');
  assert.equal(again.headers.get('x-aigw-error-source'), 'client');
  assert.equal((await again.json()).error.code, 'quota_exceeded');
  assert.deepEqual(vt.slept, []);
});

test('a short named wait is waited out once', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10 ** 6);
  gw.script.push([429, { 'retry-after': '2', 'retry-after-ms': '2000' }, error('upstream_quota_exhausted')]);
  const [r] = await vt.run(chat(setup(vt, gw)));
  assert.equal(r.status, 200);
  assert.deepEqual(gw.calls.map(([, s]) => s), [429, 200]);
  near(gw.calls[1][0], 2 + 0.5 * 0.45);
});

test('no named wait: full-jitter backoff within the attempts', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10 ** 6);
  for (let i = 0; i < 4; i++) gw.script.push([503, {}, error('upstream_unreachable')]);
  const [r] = await vt.run(chat(setup(vt, gw, { maxAttempts: 3 })));
  assert.equal(r.status, 503);
  assert.equal(gw.calls.length, 3);
  assert.equal(r.headers.get('x-should-retry'), 'false');
  assert.deepEqual(vt.slept.filter((d) => d !== 0.05), [0.25, 0.5]);
});

test('a wait past mostWait is not sat out', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10 ** 6);
  gw.script.push([429, { 'retry-after': '120' }, error('api_key_circuit_open')]);
  const [r] = await vt.run(chat(setup(vt, gw, { mostWait: 60 })));
  assert.equal(r.status, 429);
  assert.equal(gw.calls.length, 1);
  assert.deepEqual(vt.slept, []);
  near(retryAt(r), T0 + 123, 1);
});

test('an SDK retry is a single attempt', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10 ** 6);
  for (let i = 0; i < 3; i++) gw.script.push([503, {}, error('upstream_unreachable')]);
  const warn = console.warn;
  console.warn = () => {};
  try {
    const [r] = await vt.run(chat(setup(vt, gw), { headers: { 'x-stainless-retry-count': '1' } }));
    assert.equal(r.status, 503);
    assert.equal(gw.calls.length, 1);
  } finally {
    console.warn = warn;
  }
});

test('a refused connection is tried again', async () => {
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 10 ** 6);
  let fail = 1;
  const flaky = async (url, init) => {
    if (fail && !String(url).endsWith('/quota')) {
      fail -= 1;
      throw new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } });
    }
    return gw.fetch(url, init);
  };
  const f = setup(vt, gw, {}, flaky);
  const [r] = await vt.run(chat(f));
  assert.equal(r.status, 200);
  for (const ks of f.pacer.keys.values()) assert.deepEqual(ks.slots, []);
});

test('an abort while waiting rejects and gives the slot back', async () => {
  const vt = new VirtualTime(T0 + 30);
  const gw = new SimGateway(vt, 10);
  const f = setup(vt, gw, { mostWait: 120 });
  await vt.run(chat(f));
  const ac = new AbortController();
  const waiting = chat(f, { signal: ac.signal });
  await new Promise((r) => setImmediate(r));
  ac.abort();
  await assert.rejects(waiting, { name: 'AbortError' });
  for (const ks of f.pacer.keys.values()) assert.deepEqual(ks.slots, []);
});

test('the openai SDK raises its own error with the time to come back', async () => {
  const { default: OpenAI } = await import('openai');
  const vt = new VirtualTime();
  const gw = new SimGateway(vt, 2);
  // Two calls a minute: the second waits 30 s, the third would wait until the next minute.
  const client = new OpenAI({ baseURL: 'http://gw.test/v1', apiKey: 'sk-aigw-test', fetch: setup(vt, gw, { mostWait: 30 }) });
  const call = () => client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
  await vt.run(call(), call());
  const [e] = await vt.run(call().catch((err) => err));
  assert.ok(e instanceof OpenAI.RateLimitError, String(e));
  assert.equal(e.code, 'wait_too_long');
  near(retryAt(e), T0 + 61, 1);
  assert.equal(gw.calls.length, 2, 'never sent, and the SDK did not retry');
});
