// What a gateway answer says about when to call again: pure functions, no I/O, no clock.
//
// Two kinds of signal are read: the quota standing sent with every routed answer
// (`x-aigw-quota-<metric>-limit|remaining|reset` for the tightest policy of each metric: `requests`,
// `tokens`, `prompt_tokens`, `completion_tokens`, `credits`; and the
// IETF `RateLimit-Policy` / `RateLimit` fields for the tightest overall), and what a refusal says
// (`x-should-retry`, `Retry-After` in seconds or as an HTTP-date, `retry-after-ms`, and the error
// body's `code`, `reset_at`, `blocked_until`).

/** Statuses worth another try when nothing says otherwise: the ones the official SDKs retry. */
export const RETRYABLE_STATUSES = new Set([408, 409, 429, 500, 502, 503, 504, 529]);

/**
 * The gateway reports a quota's reset 60 to 120 s after its window really ends (spread per
 * subject, so that a refused crowd does not come back at once), and every window ends on a whole
 * minute. The pacer spreads calls until the real end, found from the reset with this.
 */
export const GATEWAY_RESET_DELAY_MIN = 60;

/** The metrics as the gateway names them to clients: `tokens` is the `total_tokens` policy's (seed 003's name). */
export const METRICS = ['requests', 'tokens', 'prompt_tokens', 'completion_tokens', 'credits'];

/** The names a metric's headers may go by, the first preferred: a gateway before seed 003's name sent only `total_tokens`. */
const HEADER_NAMES = { tokens: ['tokens', 'total_tokens'] };

/**
 * A metric as the helper names it, whatever name the gateway gave: `total_tokens` (a policy's
 * name, or an older gateway's) is `tokens`.
 * @param {string} name
 */
export function metricName(name) {
  return name === 'total_tokens' ? 'tokens' : name;
}

const WINDOW_SECONDS = { minute: 60, hour: 3600, day: 86400, week: 7 * 86400 };

/** @param {Headers | Record<string, string>} headers @param {string} name */
export function header(headers, name) {
  if (typeof headers?.get === 'function') return headers.get(name) ?? undefined;
  const lower = name.toLowerCase();
  for (const [k, v] of Object.entries(headers ?? {})) if (k.toLowerCase() === lower) return v;
  return undefined;
}

/** @param {string | undefined | null} v */
function number(v) {
  if (v === undefined || v === null || String(v).trim() === '') return undefined;
  const n = Number(String(v).trim());
  return Number.isFinite(n) ? n : undefined;
}

/** Unix seconds of an RFC 3339 time, else undefined. @param {unknown} v */
export function parseRfc3339(v) {
  if (typeof v !== 'string' || !/^\d{4}-\d\d-\d\dT/.test(v)) return undefined;
  const ms = Date.parse(v);
  return Number.isFinite(ms) ? ms / 1000 : undefined;
}

/**
 * Seconds to wait as the answer names it: `retry-after-ms` (the finer one) else `Retry-After` in
 * seconds or as an HTTP-date, relative to `now` (Unix seconds).
 */
export function parseWait(headers, now) {
  const ms = number(header(headers, 'retry-after-ms'));
  if (ms !== undefined && ms >= 0) return ms / 1000;
  const ra = header(headers, 'retry-after');
  if (ra === undefined) return undefined;
  const secs = number(ra);
  if (secs !== undefined) return Math.max(secs, 0);
  const at = Date.parse(ra);
  return Number.isFinite(at) ? Math.max(at / 1000 - now, 0) : undefined;
}

/** The first item of an IETF structured field (`"name";q=5;w=60`): its name and params. */
function sfParams(value) {
  const parts = value.split(',')[0].split(';').map((p) => p.trim());
  const name = parts[0] ? parts[0].replace(/^"|"$/g, '') : undefined;
  /** @type {Record<string, string>} */
  const params = {};
  for (const p of parts.slice(1)) {
    const i = p.indexOf('=');
    if (i > 0) params[p.slice(0, i).trim()] = p.slice(i + 1).trim().replace(/^"|"$/g, '');
  }
  return { name, params };
}

/**
 * A gateway window name's length in seconds (`minute`, `5minutes`, `day`, `week`); undefined for
 * `total` and `month` (no fixed length) or an unknown name.
 */
export function windowSeconds(window) {
  if (!window) return undefined;
  if (window in WINDOW_SECONDS) return WINDOW_SECONDS[window];
  const m = /^(\d+)minutes$/.exec(window);
  return m ? Number(m[1]) * 60 : undefined;
}

/**
 * Every quota reading of an answer: one per `x-aigw-quota-<metric>-*` metric; else, from a
 * server that sends only the IETF fields, the one `RateLimit` names.
 * @returns {import('./index.js').Reading[]}
 */
export function parseStanding(headers, now) {
  let policyName;
  let policy = {};
  const rp = header(headers, 'ratelimit-policy');
  if (rp) ({ name: policyName, params: policy } = sfParams(rp));
  const out = [];
  for (const metric of METRICS) {
    const sentAs = (HEADER_NAMES[metric] ?? [metric]).find((n) =>
      number(header(headers, `x-aigw-quota-${n}-limit`)) !== undefined
      && number(header(headers, `x-aigw-quota-${n}-remaining`)) !== undefined);
    if (sentAs === undefined) continue;
    const limit = number(header(headers, `x-aigw-quota-${sentAs}-limit`));
    const remaining = number(header(headers, `x-aigw-quota-${sentAs}-remaining`));
    const reset = number(header(headers, `x-aigw-quota-${sentAs}-reset`));
    let name;
    let window;
    // RateLimit-Policy describes the tightest policy overall: `<subject>-<metric>-<window>`.
    if (policyName && metricName(policyName.split('-')[1] ?? '') === metric) {
      name = policyName;
      window = number(policy.w) ?? windowSeconds(policyName.split('-').slice(2).join('-'));
    }
    out.push({ metric, limit, remaining, reset, window, name, delayed: true });
  }
  if (out.length) return out;
  const rl = header(headers, 'ratelimit');
  if (rl) {
    const { name, params } = sfParams(rl);
    const r = number(params.r);
    const t = number(params.t);
    const q = name === policyName ? number(policy.q) : undefined;
    if (r !== undefined && q !== undefined) {
      out.push({ metric: 'requests', limit: q, remaining: r, reset: t !== undefined ? now + t : undefined,
        window: number(policy.w), name, delayed: false });
    }
  }
  return out;
}

/** The `error` object of an OpenAI- or Anthropic-shaped error body, else {}. */
export function errorOf(body) {
  if (Array.isArray(body) && body.length) body = body[0];
  const e = body && typeof body === 'object' ? body.error : undefined;
  return e && typeof e === 'object' ? e : {};
}

/**
 * What an answer means for the caller, by the gateway's contract:
 * 1. below 400: ok;
 * 2. `x-should-retry: false`: final at once; the refusal's own time to come back is `reset_at`
 *    (a used-up quota; none for a `total` window), `blocked_until` (an open breaker), never (a
 *    banned key), else the named wait;
 * 3. a retryable status (or `x-should-retry: true`) that names a wait: retry after it;
 * 4. a retryable status naming no wait: retry after a backoff;
 * 5. anything else (a request error, an invalid key): final, passed on as is.
 * @returns {import('./index.js').Verdict}
 */
export function classify(status, headers, body, now) {
  if (status < 400) return { kind: 'ok', scope: 'key', close: false, forever: false };
  const err = errorOf(body);
  const code = typeof err.code === 'string' ? err.code : undefined;
  const source = header(headers, 'x-aigw-error-source');
  const scope = code === 'upstream_quota_exhausted' || source === 'upstream' ? 'model' : 'key';
  const wait = parseWait(headers, now);
  const shouldRetry = (header(headers, 'x-should-retry') ?? '').trim().toLowerCase();
  const namedAt = wait !== undefined ? now + wait : undefined;
  const v = (kind, extra = {}) => ({ kind, wait, retryAt: undefined, code, scope, close: false, forever: false, ...extra });
  if (code === 'api_key_permanently_banned') return v('final', { wait: undefined, scope: 'key', close: true, forever: true });
  if (code === 'quota_exceeded') {
    // A `total` window never resets (retryAt undefined): only an administrator can raise it.
    return v('final', { retryAt: parseRfc3339(err.reset_at), scope: 'key', close: true });
  }
  if (shouldRetry === 'false') {
    let at = namedAt;
    if (code === 'api_key_circuit_open') at = parseRfc3339(err.blocked_until) ?? namedAt;
    return v('final', { retryAt: at, close: at !== undefined });
  }
  if (RETRYABLE_STATUSES.has(status) || shouldRetry === 'true') return v('retry', { retryAt: namedAt });
  return v('final', { wait: undefined });
}
