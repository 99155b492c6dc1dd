// The pacer's decisions, on virtual time.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Pacer } from '../../src/index.js';
import { T0, VirtualTime, error, rfc3339 } from '../fakes.js';

const KEY = 'key-1';

// random() = 0.5: extras and jitter are half their bound, so the tests can name them.
const pacer = (vt, settings = {}) => new Pacer(settings, { clock: vt.clock, wall: vt.wall, random: () => 0.5 });

const row = (limit, remaining, reset, window = 'minute', mode = 'enforce') => ({
  subject: 'apikey', metric: 'requests', window, mode, limit, used: limit - remaining, remaining, reset_at: rfc3339(reset) });

function starts(p, n, model = undefined, allowance = 1e9) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const plan = p.plan(KEY, model, allowance);
    out.push(plan.kind === 'go' ? plan.ticket.start : undefined);
  }
  return out;
}

const close = (got, want, eps = 1e-6) => {
  assert.equal(got.length, want.length, `${got} vs ${want}`);
  got.forEach((g, i) => assert.ok(Math.abs(g - want[i]) < eps, `${got} vs ${want}`));
};

test('a token quota is one budget from the list and the headers', () => {
  // `GET /v1/quota` names it `tokens` (a gateway before seed 003's name: `total_tokens`); the
  // answers' headers report it under `tokens` while RateLimit-Policy names another policy.
  for (const metric of ['tokens', 'total_tokens']) {
    const vt = new VirtualTime();
    const p = pacer(vt);
    p.primed(KEY, [{ ...row(30000, 30000, T0 + 86400, 'day'), metric }]);
    assert.deepEqual([...p.keys.get(KEY).budgets.values()].map((b) => b.metric), ['tokens'], metric);
    const t = p.plan(KEY, undefined, 60).ticket;
    p.observe(t, 200, new Headers({ 'x-aigw-quota-tokens-limit': '30000', 'x-aigw-quota-tokens-remaining': '29000',
      'x-aigw-quota-tokens-reset': String(T0 + 86400), 'ratelimit-policy': '"ws-requests-day";q=100000;w=86400' }));
    assert.deepEqual([...p.keys.get(KEY).budgets.values()].map((b) => b.remaining), [29000], metric);
  }
});

test('what remains is spread until the window really ends', () => {
  const vt = new VirtualTime(T0 + 30); // half way through the minute 08:00
  const p = pacer(vt);
  assert.equal(p.plan(KEY, undefined, 60).kind, 'prime');
  // The gateway reports the reset 90 s after the window's end (08:01:00 → 08:02:30).
  p.primed(KEY, [row(10, 10, T0 + 60 + 90)]);
  const got = starts(p, 12);
  close(got.slice(0, 10), [...Array(10).keys()].map((i) => 3 * i));
  // The 11th waits for the next window (+1 s of clock margin); then 59 s / 10 apart.
  close(got.slice(10), [31, 36.9]);
});

test('resetDelay 0 paces until the reported reset', () => {
  const vt = new VirtualTime(T0 + 30);
  const p = pacer(vt, { resetDelay: 0 });
  p.primed(KEY, [row(10, 10, T0 + 60 + 90)]);
  close(starts(p, 2), [0, 12]);
});

test('shadow policies do not pace', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, [row(1, 1, T0 + 150, 'minute', 'shadow')]);
  assert.deepEqual(starts(p, 3), [0, 0, 0]);
});

test('a crowd is spread over as many windows as it needs', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, [row(2, 2, T0 + 60 + 75)]);
  const got = starts(p, 9);
  const perWindow = [0, 1, 2, 3, 4].map((w) => got.filter((t) => t >= w * 60 && t < (w + 1) * 60).length);
  assert.deepEqual(perWindow, [2, 2, 2, 2, 1]);
  close([got[2]], [61]);
});

test('answers update the standing, and calls in flight are counted', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, []);
  const a = p.plan(KEY, undefined, 60).ticket;
  p.plan(KEY, undefined, 60);
  p.observe(a, 200, new Headers({ 'x-aigw-quota-requests-limit': '5', 'x-aigw-quota-requests-remaining': '4',
    'x-aigw-quota-requests-reset': String(T0 + 120), 'ratelimit-policy': '"apikey-requests-minute";q=5;w=60' }));
  // 4 left, one of them taken by the call still in flight: 3 over the 60 s left, 20 s apart.
  close(starts(p, 2), [0, 20]);
});

test('a wait past mostWait is refused at once with the time to come back', () => {
  const vt = new VirtualTime(T0 + 30);
  const p = pacer(vt);
  p.primed(KEY, [row(10, 0, T0 + 150)]);
  const plan = p.plan(KEY, undefined, 10);
  assert.equal(plan.kind, 'refuse');
  const r = plan.refusal;
  assert.equal(r.status, 429);
  close([r.retryAt], [T0 + 61]);
  const body = JSON.parse(r.body).error;
  assert.deepEqual([body.code, body.retry_after], ['wait_too_long', 31]);
  const h = Object.fromEntries(r.headers);
  assert.deepEqual([h['x-aigw-error-source'], h['x-should-retry'], h['x-aigw-client-retry-at']], ['client', 'false', String(T0 + 61)]);
  close(starts(p, 1, undefined, 60), [31]);
});

test('a call that cannot wait for its paced turn goes while the quota has room', () => {
  // 1000 a day, 08:00 local: the pace is one call every 86 s, more than the 60 s a call waits.
  const vt = new VirtualTime(T0);
  const p = pacer(vt);
  p.primed(KEY, [row(1000, 1000, T0 + 86400 + 90, 'day')]);
  assert.deepEqual(starts(p, 3, undefined, 60), [0, 0, 0], 'not refused: 1000 remain');
  // A call that can wait keeps to the pace, after the calls already planned.
  close(starts(p, 1), [86400 / 1000]);
});

test('calls that cannot wait use what the window has left and no more', () => {
  const vt = new VirtualTime(T0 + 30);
  const p = pacer(vt);
  p.primed(KEY, [row(10, 10, T0 + 60 + 90)]);
  const got = starts(p, 14, undefined, 10);
  // Paced: 0, 3, 6, 9; then the 6 the window still has go at once; the rest would wait for the
  // next window (31 s): told when to come back.
  close(got.slice(0, 4), [0, 3, 6, 9]);
  assert.deepEqual(got.slice(4), [0, 0, 0, 0, 0, 0, undefined, undefined, undefined, undefined]);
});

test('a quota refusal closes the key until its reset', () => {
  const vt = new VirtualTime(T0 + 10);
  const p = pacer(vt);
  p.primed(KEY, []);
  const t = p.plan(KEY, 'm', 60).ticket;
  const body = error('quota_exceeded', { reset_at: rfc3339(T0 + 150) });
  const raw = JSON.stringify(body);
  const headers = [['x-should-retry', 'false'], ['x-aigw-error-source', 'gateway'], ['content-type', 'application/json']];
  const v = p.observe(t, 429, new Headers(headers), body, headers, raw);
  assert.deepEqual([v.kind, v.retryAt], ['final', T0 + 150]);
  for (const model of ['m', 'other']) {
    const plan = p.plan(KEY, model, 60);
    assert.equal(plan.kind, 'refuse');
    assert.equal(plan.refusal.body, raw);
    const h = Object.fromEntries(plan.refusal.headers);
    assert.deepEqual([h['x-aigw-error-source'], h['retry-after']], ['client', '140']);
  }
  vt.t += 140;
  assert.equal(p.plan(KEY, 'm', 60).kind, 'go');
});

test('a banned key stays closed', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, []);
  const t = p.plan(KEY, undefined, 60).ticket;
  p.observe(t, 403, new Headers({ 'x-should-retry': 'false' }), error('api_key_permanently_banned'));
  vt.t += 86400 * 30;
  const plan = p.plan(KEY, undefined, 60);
  assert.equal(plan.kind, 'refuse');
  assert.equal(plan.refusal.retryAt, undefined);
});

test('a refusal for one model holds that model only', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, []);
  const t = p.plan(KEY, 'm', 60).ticket;
  p.sent(t);
  p.observe(t, 429, new Headers({ 'retry-after': '2' }), error('upstream_quota_exhausted'));
  close(starts(p, 1, 'm'), [2 + 0.5 * 0.45]);
  assert.deepEqual(starts(p, 1, 'other'), [0]);
});

test('the rate an upstream let through spaces the calls after its wait', () => {
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0 });
  p.primed(KEY, []);
  const tickets = [...Array(25)].map(() => p.plan(KEY, 'm', 60).ticket);
  tickets.forEach((t) => p.sent(t));
  vt.t += 0.5;
  tickets.slice(0, 20).forEach((t) => p.observe(t, 200, new Headers()));
  const refused = new Headers({ 'retry-after': '1' });
  p.observe(tickets[20], 429, refused, error('upstream_quota_exhausted'));
  // Sent before that refusal: they say nothing new about the rate.
  tickets.slice(21).forEach((t) => p.observe(t, 429, refused, error('upstream_quota_exhausted')));
  const rate = 20 / 1.5;
  close(starts(p, 3, 'm'), [1.5, 1.5 + 1 / rate, 1.5 + 2 / rate], 1e-3);
});

test('retry delays are the named wait plus a little, else full jitter', () => {
  const p = pacer(new VirtualTime());
  close([p.retryDelay({ wait: 30 }, 1)], [30 + 0.5 * 3.25]);
  close([p.retryDelay({ wait: 600 }, 1)], [600 + 2.5]);
  close([1, 2, 3, 6].map((a) => p.retryDelay({}, a)), [0.25, 0.5, 1, 4]);
});

test('one reads the quotas while the others wait a moment', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  assert.equal(p.plan(KEY, undefined, 60).kind, 'prime');
  assert.deepEqual(p.plan(KEY, undefined, 60), { kind: 'poll', wait: 0.05 });
  assert.equal(p.plan(KEY, undefined, 0.01).kind, 'go');
  p.primed(KEY, undefined);
  assert.equal(p.plan(KEY, undefined, 60).kind, 'go');
});

test('answers of a burst that come after its first refusal count toward the rate', () => {
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0 });
  p.primed(KEY, []);
  const tickets = [...Array(30)].map(() => p.plan(KEY, 'm', 60).ticket);
  tickets.forEach((t) => p.sent(t));
  vt.t += 0.05;
  const refused = new Headers({ 'retry-after': '1' });
  // The refusals of the burst come back first, its 20 successes just after.
  tickets.slice(20).forEach((t) => p.observe(t, 429, refused, error('upstream_quota_exhausted')));
  tickets.slice(0, 20).forEach((t) => p.observe(t, 200, new Headers()));
  const rate = 20 / 1.05;
  close(starts(p, 2, 'm'), [1.05, 1.05 + 1 / rate], 1e-3);
});

test('the extra after a hold is each call\'s own', () => {
  const vt = new VirtualTime();
  const p = pacer(vt);
  p.primed(KEY, []);
  const t = p.plan(KEY, 'm', 60).ticket;
  p.sent(t);
  p.observe(t, 429, new Headers({ 'retry-after': '2' }), error('upstream_quota_exhausted'));
  const extra = 0.5 * 0.45;
  close(starts(p, 3, 'm'), [2 + extra, 2 + extra, 2 + extra]);
});

test('a refusal at most halves the rate', () => {
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0, rateGrowth: 1e9 });
  p.primed(KEY, []);
  const refused = new Headers({ 'retry-after': '1' });
  const cycle = (served) => {
    const tickets = [...Array(served + 1)].map(() => p.plan(KEY, 'm', 1e9).ticket);
    for (const t of tickets) {
      vt.t = Math.max(vt.t, t.start);
      p.sent(t);
    }
    tickets.slice(0, served).forEach((t) => p.observe(t, 200, new Headers()));
    p.observe(tickets[served], 429, refused, error('upstream_quota_exhausted'));
  };
  cycle(40); // 40 in 0 s, then 1 s of wait: 40/s
  close(starts(p, 2, 'm').map((t) => t - vt.t), [1, 1 + 1 / 40]);
  cycle(2); // a short unlucky cycle would say 2/s: the rate only halves
  const [a, b] = starts(p, 2, 'm');
  close([b - a], [1 / 20]);
});

// A first burst: `served` calls go through in `after` s, the next is refused with a wait of
// `wait` s: the pacer learns served / (after + wait).
function learnRate(p, vt, served = 20, after = 0.05, wait = '1') {
  const tickets = [...Array(served + 1)].map(() => p.plan(KEY, 'm', 1e9).ticket);
  tickets.forEach((t) => p.sent(t));
  vt.t += after;
  tickets.slice(0, served).forEach((t) => p.observe(t, 200, new Headers()));
  p.observe(tickets[served], 429, new Headers({ 'retry-after': wait }), error('upstream_quota_exhausted'));
}

// Sends `n` calls one by one at their paced turn, each refused with the few milliseconds left.
function refusedOneByOne(p, vt, tickets) {
  for (const t of tickets) {
    vt.t = Math.max(vt.t, t.start);
    p.sent(t);
    vt.t += 0.002; // its answer comes back before the next call goes
    p.observe(t, 429, new Headers({ 'retry-after-ms': '3' }), error('upstream_quota_exhausted'));
  }
}

test('refusals of one burst cut the rate once, not once each', () => {
  // The calls already paced when the upstream refuses go out one by one into the same parked
  // credential: one burst, so one cut.
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0, rateGrowth: 1e9 });
  p.primed(KEY, []);
  learnRate(p, vt); // 20 / 1.05 s
  const rate = 20 / 1.05;
  refusedOneByOne(p, vt, [...Array(30)].map(() => p.plan(KEY, 'm', 1e9).ticket));
  const ms = p.keys.get(KEY).models.get('m');
  assert.ok(Math.abs(ms.hold - (vt.t + 0.003)) < 1e-6, 'a wait the server named still bounds the next call');
  const got = starts(p, 10, 'm', 8);
  assert.ok(!got.includes(undefined), 'no call refused locally with wait_too_long');
  assert.ok(got[0] >= ms.hold);
  const [a, b] = got.slice(-2);
  assert.ok(Math.abs((b - a) - 2 / rate) < 1e-6, `cut once, by half: ${b - a}`);
});

test('a run of cuts stops at the floor', () => {
  // Each refusal from a call given its turn after the previous cut, in a cycle where nothing was
  // served: each may halve the rate, but never below minRate.
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0, rateGrowth: 1e9, minRate: 1 });
  p.primed(KEY, []);
  learnRate(p, vt);
  for (let i = 0; i < 30; i++) refusedOneByOne(p, vt, [p.plan(KEY, 'm', 1e9).ticket]);
  const got = starts(p, 3, 'm', 8);
  close([got[2] - got[1]], [1], 1e-6);
});

test('the floor does not raise a rate the upstream measured lower', () => {
  const vt = new VirtualTime();
  const p = pacer(vt, { extraBase: 0, extraShare: 0, rateGrowth: 1e9, minRate: 1 });
  p.primed(KEY, []);
  learnRate(p, vt, 1, 0, '20'); // a slow provider: 1 call per 20 s
  const [a, b] = starts(p, 2, 'm');
  close([b - a], [20], 1e-6);
});
