import { header, parseRfc3339, parseWait } from './signals.js';

/**
 * When calling again makes sense, in Unix seconds, for an SDK error (`OpenAI.APIError`: its
 * `headers` and `error`) or a `Response` (headers only); undefined when the answer names no time
 * (a request error, a banned key, a `total` quota used up).
 *
 * Read from, in order: `x-aigw-client-retry-at` (set by this package), the error body's
 * `reset_at` (a used-up quota) or `blocked_until` (an open breaker), `Retry-After` /
 * `retry-after-ms`.
 * @param {{headers?: Headers, error?: any}} errorOrResponse
 * @returns {number | undefined}
 */
export function retryAt(errorOrResponse) {
  const headers = errorOrResponse?.headers;
  if (!headers) return undefined;
  const mine = Number(header(headers, 'x-aigw-client-retry-at'));
  if (header(headers, 'x-aigw-client-retry-at') !== undefined && Number.isFinite(mine)) return mine;
  const err = errorOrResponse.error;
  if (err && typeof err === 'object') {
    for (const field of ['reset_at', 'blocked_until']) {
      const at = parseRfc3339(err[field]);
      if (at !== undefined) return at;
    }
  }
  const now = Date.now() / 1000;
  const wait = parseWait(headers, now);
  return wait !== undefined ? now + wait : undefined;
}
