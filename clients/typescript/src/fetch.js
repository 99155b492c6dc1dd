// A `fetch` that paces and retries every call through a Pacer, for the official `openai` SDK's
// `fetch` option. It wraps the fetch that really sends (the global one by default). Every error
// answer it passes on carries `x-should-retry: false`: it is final, so an SDK whose `maxRetries`
// is not 0 does not retry it again (one retry layer, end to end). An SDK that retries all the same
// (after a connection error) is counted: its retries are single attempts.

import { createHash } from 'node:crypto';

import { Pacer } from './pacer.js';

/** Error causes raised before anything was sent: safe to try again. */
const NOT_SENT = new Set(['ECONNREFUSED', 'UND_ERR_CONNECT_TIMEOUT', 'ENOTFOUND', 'EAI_AGAIN']);
/** The largest request body read to find the model it names. */
const MODEL_SCAN_LIMIT = 2 * 1024 * 1024;

/** The gateway key a request presents, as an opaque id (the key itself is not kept). */
export function keyOf(url, headers) {
  const cred = headers.get('authorization') ?? headers.get('x-api-key') ?? '';
  return createHash('sha256').update(`${url.origin}\0${cred}`).digest('hex').slice(0, 24);
}

/** The `model` a JSON request body names, if any. */
export function modelOf(method, body) {
  if (method !== 'POST' || typeof body !== 'string' || body.length > MODEL_SCAN_LIMIT) return undefined;
  try {
    const m = JSON.parse(body)?.model;
    return typeof m === 'string' ? m : undefined;
  } catch {
    return undefined;
  }
}

/** `GET /v1/quota` on the same gateway, with the same key. */
export function quotaUrl(url) {
  const i = url.pathname.indexOf('/v1/');
  const prefix = i >= 0 ? url.pathname.slice(0, i) : '';
  return new URL(`${prefix}/v1/quota`, url.origin);
}

function abortError(signal) {
  return signal?.reason ?? new DOMException('This operation was aborted', 'AbortError');
}

/** Sleeps `seconds`, or rejects as soon as `signal` aborts. */
export function sleep(seconds, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, Math.max(seconds, 0) * 1000);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A Response rebuilt from a read one, so that it can be passed on with headers added. */
function rebuilt(res, text, extraHeaders) {
  const headers = new Headers(res.headers);
  for (const h of ['content-length', 'content-encoding', 'transfer-encoding']) headers.delete(h);
  for (const [k, v] of extraHeaders) headers.set(k, v);
  return new Response(text, { status: res.status, statusText: res.statusText, headers });
}

/** Marks an error answer as final for the SDK, with the time to come back if known. */
function final(res, text, verdict, retryAt) {
  const at = retryAt ?? verdict.retryAt;
  const extra = [['x-should-retry', 'false']];
  if (at !== undefined) extra.push(['x-aigw-client-retry-at', String(Math.ceil(at))]);
  return rebuilt(res, text, extra);
}

/**
 * A `fetch` whose calls are paced, for `new OpenAI({ fetch: pacedFetch() })`.
 * @param {import('./index.js').PacedFetchOptions} [options]
 * @returns {typeof fetch}
 */
export function pacedFetch(options = {}) {
  const { pacer: shared, fetch: inner = globalThis.fetch, sleep: pause = sleep, wall = () => Date.now() / 1000, ...settings } = options;
  if (shared && Object.keys(settings).length) throw new TypeError('give either a pacer or settings, not both');
  const pacer = shared ?? new Pacer(settings);
  let warned = false;

  async function readQuota(url, headers, signal) {
    const auth = {};
    for (const h of ['authorization', 'x-api-key']) if (headers.has(h)) auth[h] = headers.get(h);
    try {
      const r = await inner(quotaUrl(url), { method: 'GET', headers: auth, signal });
      if (r.status !== 200) {
        await r.body?.cancel();
        return undefined;
      }
      const data = (await r.json())?.data;
      return Array.isArray(data) ? data : undefined;
    } catch (e) {
      if (signal?.aborted) throw e;
      return undefined;
    }
  }

  async function paced(input, init = {}) {
    if (input instanceof Request) {
      init = { method: input.method, headers: input.headers, signal: input.signal,
        body: input.body ? await input.arrayBuffer() : undefined, ...init };
      input = input.url;
    }
    const url = new URL(String(input));
    const method = (init.method ?? 'GET').toUpperCase();
    const headers = new Headers(init.headers);
    const body = init.body ?? undefined;
    const signal = init.signal ?? undefined;
    const replayable = body === undefined || typeof body === 'string' || body instanceof ArrayBuffer
      || ArrayBuffer.isView(body) || body instanceof URLSearchParams || body instanceof Blob || body instanceof FormData;
    const s = pacer.settings;
    const key = keyOf(url, headers);
    const model = modelOf(method, body);
    const sdkRetry = Number(headers.get('x-stainless-retry-count') ?? '0') > 0;
    if (sdkRetry && !warned) {
      warned = true;
      console.warn('aigw-client: the SDK retries on top of pacedFetch: create it with maxRetries: 0 '
        + '(its retries are counted as single attempts meanwhile)');
    }
    const single = sdkRetry || !replayable;
    let waited = 0;
    let attempt = 0;
    for (;;) {
      const plan = pacer.plan(key, model, s.mostWait - waited);
      if (plan.kind === 'prime') {
        pacer.primed(key, await readQuota(url, headers, signal));
        continue;
      }
      if (plan.kind === 'poll') {
        await pause(plan.wait, signal);
        waited += plan.wait;
        continue;
      }
      if (plan.kind === 'refuse') {
        const r = plan.refusal;
        return new Response(r.body, { status: r.status, headers: r.headers });
      }
      const ticket = plan.ticket;
      let res;
      try {
        if (plan.wait > 0) {
          await pause(plan.wait, signal);
          waited += plan.wait;
        }
        pacer.sent(ticket);
        attempt += 1;
        res = await inner(url.href, { ...init, method, headers, body, signal });
      } catch (e) {
        pacer.cancel(ticket);
        const notSent = NOT_SENT.has(e?.cause?.code) || NOT_SENT.has(e?.code);
        if (!notSent || signal?.aborted) throw e;
        const delay = pacer.retryDelay({ kind: 'retry' }, attempt);
        if (single || attempt >= s.maxAttempts || waited + delay > s.mostWait) throw e;
        await pause(delay, signal);
        waited += delay;
        continue;
      }
      let text = '';
      let json;
      if (res.status >= 400) {
        try {
          text = await res.text();
        } catch (e) {
          pacer.cancel(ticket);
          throw e;
        }
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
      }
      const verdict = pacer.observe(ticket, res.status, res.headers, json, [...res.headers], json !== undefined ? text : '');
      if (verdict.kind === 'ok') return res;
      if (verdict.kind === 'retry') {
        const delay = pacer.retryDelay(verdict, attempt);
        if (!single && attempt < s.maxAttempts && waited + delay <= s.mostWait) {
          await pause(delay, signal);
          waited += delay;
          continue;
        }
        return final(res, text, verdict, wall() + delay);
      }
      return final(res, text, verdict, undefined);
    }
  }

  paced.pacer = pacer;
  return paced;
}

export { retryAt } from './retry-at.js';
