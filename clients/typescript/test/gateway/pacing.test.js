// pacedFetch under the official openai SDK, against a running aigw and the mock upstream.
//
// The pacing test runs until the current minute's quota window has ended and a little into the
// next one: from a few seconds up to a minute, depending on when it starts.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import OpenAI from 'openai';

import { pacedFetch, retryAt } from '../../src/index.js';
import { start } from './aigw.js';

const KEYS = Object.fromEntries(['paced', 'plain', 'spent', 'waits'].map((n) =>
  [n, `sk-aigw-TsPacing${n[0].toUpperCase()}${n.slice(1)}0123456789abcdefghi`]));
const LIMIT = 20; // requests per minute on the keys `paced` and `plain`

const RESOURCES = `
[[workspace]]
name = "acme"
[[member]]
workspace = "acme"
email = "app@acme.test"
role = "member"
${Object.entries(KEYS).map(([name, key]) => `
[[api_key]]
member = "app@acme.test"
name = "${name}"
key = "${key}"
`).join('')}
${['paced', 'plain'].map((name) => `
[[policy]]
workspace = "acme"
subject = "apikey"
target = "app@acme.test/${name}"
metric = "requests"
window = "minute"
limit = ${LIMIT}
`).join('')}
[[policy]]
workspace = "acme"
subject = "apikey"
target = "app@acme.test/spent"
metric = "requests"
window = "day"
limit = 1

[[upstream]]
workspace = "acme"
name = "mock-openai"
provider = "openai-compatible"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-openai"
models = ["gpt-4o-mini", "flaky"]
`;

const HI = [{ role: 'user', content: 'hi' }];
let gw;

before(async () => {
  gw = await start(RESOURCES);
});
after(async () => {
  await gw?.stop();
});

/** A fetch that really sends, recording what goes out and what comes back. */
function counting() {
  const sent = [];
  const f = async (url, init) => {
    const r = await fetch(url, init);
    sent.push([new URL(url).pathname, r.status]);
    return r;
  };
  f.sent = sent;
  f.calls = (path = '/v1/chat/completions') => sent.filter(([p]) => p === path).map(([, s]) => s);
  return f;
}

function paced(key, settings = {}) {
  const inner = counting();
  const client = new OpenAI({ baseURL: `${gw.gw}/v1`, apiKey: KEYS[key], maxRetries: 0, fetch: pacedFetch({ fetch: inner, ...settings }) });
  return { client, inner };
}

async function notAtAMinuteEnd() {
  const s = new Date().getSeconds();
  if (s >= 57) await new Promise((r) => setTimeout(r, (61 - s) * 1000));
}

test('pacing keeps a key under its quota', { timeout: 120_000 }, async () => {
  const calls = LIMIT + 2; // more than one window allows
  await notAtAMinuteEnd();
  // Without the helper, the same run on a key with the same quota is refused.
  const plain = new OpenAI({ baseURL: `${gw.gw}/v1`, apiKey: KEYS.plain, maxRetries: 0 });
  const outcomes = [];
  for (let i = 0; i < calls; i++) {
    outcomes.push(await plain.chat.completions.create({ model: 'gpt-4o-mini', messages: HI }).then(() => 'ok', (e) => e.code));
  }
  assert.equal(outcomes.filter((o) => o === 'quota_exceeded').length, 2, String(outcomes));

  // With it: every call is served, none is refused, through a window's end (4 at a time).
  const { client, inner } = paced('paced', { mostWait: 120 });
  const started = Date.now();
  let next = 0;
  const worker = async () => {
    while (next < calls) {
      next += 1;
      await client.chat.completions.create({ model: 'gpt-4o-mini', messages: HI });
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
  assert.deepEqual(inner.calls(), Array(calls).fill(200), 'nothing refused, nothing retried');
  assert.deepEqual(inner.calls('/v1/quota'), [200], 'the quota read once');
  assert.ok(Date.now() - started < 75_000);
});

test('a quota refusal is raised at once without a retry', async () => {
  await new OpenAI({ baseURL: `${gw.gw}/v1`, apiKey: KEYS.spent, maxRetries: 0 })
    .chat.completions.create({ model: 'gpt-4o-mini', messages: HI }); // uses up the day's 1 request
  // Not reading the quotas first, the helper learns it from the gateway's refusal.
  const { client, inner } = paced('spent', { prime: false });
  const started = Date.now();
  const e = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: HI }).catch((err) => err);
  assert.ok(Date.now() - started < 2000, 'not waited');
  assert.ok(e instanceof OpenAI.RateLimitError);
  assert.equal(e.code, 'quota_exceeded');
  assert.deepEqual(inner.calls(), [429]);
  assert.equal(e.headers.get('x-aigw-error-source'), 'gateway');
  assert.equal(retryAt(e), Date.parse(e.error.reset_at) / 1000);
  const again = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: HI }).catch((err) => err);
  assert.deepEqual(inner.calls(), [429], 'not sent');
  assert.equal(again.headers.get('x-aigw-error-source'), 'client');
  assert.equal(retryAt(again), retryAt(e));
});

test('a short upstream wait is waited out once', async () => {
  await gw.script({ model: 'flaky', times: 1, status: 429, headers: { 'retry-after': '1' },
    body: { error: { message: 'Rate limit reached for requests', type: 'requests', code: 'rate_limit_exceeded' } } });
  const { client, inner } = paced('waits');
  const started = Date.now();
  const r = await client.chat.completions.create({ model: 'flaky', messages: HI });
  const took = (Date.now() - started) / 1000;
  assert.ok(r.choices[0].message.content.startsWith('Hello'));
  assert.deepEqual(inner.calls(), [429, 200], 'one wait, one retry');
  assert.ok(took >= 1 && took < 5, String(took));
  const flaky = (await gw.mockCalls()).calls.filter((c) => c.model === 'flaky');
  assert.deepEqual(flaky.map((c) => c.status), [429, 200]);
});
