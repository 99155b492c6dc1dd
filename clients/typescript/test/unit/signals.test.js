// Reading the gateway's answers: waits, quota standing, and what each refusal means.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { classify, parseStanding, parseWait } from '../../src/index.js';
import { T0, error, rfc3339 } from '../fakes.js';

const NOW = T0; // 2027-01-15T08:00:00Z

test('named waits', () => {
  const cases = [
    [{ 'retry-after': '3' }, 3],
    [{ 'Retry-After': '1.5' }, 1.5],
    [{ 'retry-after': '3', 'retry-after-ms': '2500' }, 2.5],
    [{ 'retry-after': 'Fri, 15 Jan 2027 08:00:30 GMT' }, 30],
    [{ 'retry-after': 'Fri, 15 Jan 2027 07:00:00 GMT' }, 0],
    [{ 'retry-after': 'soon' }, undefined],
    [{ 'retry-after-ms': 'NaN' }, undefined],
    [{}, undefined],
  ];
  for (const [h, want] of cases) assert.equal(parseWait(new Headers(h), NOW), want, JSON.stringify(h));
});

test('quota headers per metric, with the tightest policy named', () => {
  const h = new Headers({
    'x-aigw-quota-requests-limit': '5', 'x-aigw-quota-requests-remaining': '4',
    'x-aigw-quota-requests-reset': '1800000087',
    'x-aigw-quota-credits-limit': '2.5', 'x-aigw-quota-credits-remaining': '1.25',
    'ratelimit-policy': '"apikey-requests-minute";q=5;w=60', ratelimit: '"apikey-requests-minute";r=4;t=87',
  });
  const [requests, credits] = parseStanding(h, NOW);
  assert.deepEqual(requests, { metric: 'requests', limit: 5, remaining: 4, reset: 1800000087, window: 60,
    name: 'apikey-requests-minute', delayed: true });
  assert.deepEqual(credits, { metric: 'credits', limit: 2.5, remaining: 1.25, reset: undefined, window: undefined,
    name: undefined, delayed: true });
});

test('the token quota is read as tokens under either name', () => {
  // Seed 003's name, which the gateway sends; the long name, from a gateway before it.
  for (const [name, policy] of [['tokens', 'apikey-tokens-day'], ['total_tokens', 'apikey-total_tokens-day']]) {
    const h = new Headers({
      [`x-aigw-quota-${name}-limit`]: '30000', [`x-aigw-quota-${name}-remaining`]: '5660',
      [`x-aigw-quota-${name}-reset`]: '1800000087',
      'ratelimit-policy': `"${policy}";q=30000;w=86400`, ratelimit: `"${policy}";r=5660;t=87`,
    });
    assert.deepEqual(parseStanding(h, NOW), [{ metric: 'tokens', limit: 30000, remaining: 5660, reset: 1800000087,
      window: 86400, name: policy, delayed: true }], name);
  }
  const both = new Headers();
  for (const n of ['tokens', 'total_tokens']) {
    both.set(`x-aigw-quota-${n}-limit`, '10');
    both.set(`x-aigw-quota-${n}-remaining`, '1');
  }
  assert.deepEqual(parseStanding(both, NOW).map((r) => r.metric), ['tokens']);
});

test('a bare RateLimit field is read as it is', () => {
  const [r] = parseStanding(new Headers({ 'ratelimit-policy': '"burst";q=100;w=10', ratelimit: '"burst";r=7;t=4' }), NOW);
  assert.deepEqual([r.limit, r.remaining, r.reset, r.window, r.delayed], [100, 7, NOW + 4, 10, false]);
});

const RESET = NOW + 150;
const BLOCKED = NOW + 600;
// Each refusal the gateway sends (codes from src/error.rs), and an upstream's passed on:
// [name, status, headers, body, [kind, wait, retryAt, scope, close]].
const CASES = [
  ['success', 200, {}, undefined, ['ok', undefined, undefined, 'key', false]],
  ['quota used up', 429, { 'x-should-retry': 'false', 'x-aigw-error-source': 'gateway' },
    error('quota_exceeded', { reset_at: rfc3339(RESET) }), ['final', undefined, RESET, 'key', true]],
  ['total quota used up', 429, { 'x-should-retry': 'false' }, error('quota_exceeded', { reset_at: null }),
    ['final', undefined, undefined, 'key', true]],
  ['breaker open, short', 429, { 'retry-after': '30', 'retry-after-ms': '30000' }, error('api_key_circuit_open'),
    ['retry', 30, NOW + 30, 'key', false]],
  ['breaker open, long', 429, { 'retry-after': '600', 'x-should-retry': 'false' },
    error('api_key_circuit_open', { blocked_until: rfc3339(BLOCKED) }), ['final', 600, BLOCKED, 'key', true]],
  ['banned key', 403, { 'x-should-retry': 'false' }, error('api_key_permanently_banned'),
    ['final', undefined, undefined, 'key', true]],
  ['every upstream parked, short', 429, { 'retry-after': '1', 'retry-after-ms': '1000' }, error('upstream_quota_exhausted'),
    ['retry', 1, NOW + 1, 'model', false]],
  ['every upstream parked, long', 429, { 'retry-after': '120', 'x-should-retry': 'false' }, error('upstream_quota_exhausted'),
    ['final', 120, NOW + 120, 'model', true]],
  ['upstream 429 passed on', 429, { 'retry-after': '2', 'x-aigw-error-source': 'upstream' }, error('rate_limit_exceeded'),
    ['retry', 2, NOW + 2, 'model', false]],
  ['upstream 429 without a wait', 429, { 'x-aigw-error-source': 'upstream' }, error('rate_limit_exceeded'),
    ['retry', undefined, undefined, 'model', false]],
  ['store unavailable', 503, { 'retry-after': '2' }, error('store_unavailable'), ['retry', 2, NOW + 2, 'key', false]],
  ['too many connections', 503, { 'retry-after': '1' }, error('too_many_connections'), ['retry', 1, NOW + 1, 'key', false]],
  ['upstream deadline', 504, {}, error('timeout'), ['retry', undefined, undefined, 'key', false]],
  ['bad request', 400, {}, error('invalid_request_error'), ['final', undefined, undefined, 'key', false]],
  ['invalid key', 401, {}, error('invalid_api_key'), ['final', undefined, undefined, 'key', false]],
  ['a 400 the server wants retried', 400, { 'x-should-retry': 'true' }, undefined, ['retry', undefined, undefined, 'key', false]],
];

for (const [name, status, headers, body, want] of CASES) {
  test(`what it means: ${name}`, () => {
    const v = classify(status, new Headers(headers), body, NOW);
    assert.deepEqual([v.kind, v.wait, v.retryAt, v.scope, v.close], want);
  });
}

test('a banned key stays closed for good', () => {
  const v = classify(403, new Headers({ 'x-should-retry': 'false' }), error('api_key_permanently_banned'), NOW);
  assert.ok(v.forever && v.close);
});
