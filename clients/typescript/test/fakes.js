// Virtual time and a simulated gateway, so that pacing is tested without sleeping.

/** A Unix time on a whole minute (2027-01-15T08:00:00Z): windows are easy to reason about. */
export const T0 = 1_800_000_000 - (1_800_000_000 % 60);

/** A clock that moves only when something sleeps; `run` wakes sleepers in time order. */
export class VirtualTime {
  constructor(start = T0) {
    this.t = 0;
    this.start = start;
    this.slept = [];
    this.sleepers = [];
    this.seq = 0;
    this.clock = () => this.t;
    this.wall = () => this.start + this.t;
    this.sleep = (d, signal) => {
      this.slept.push(d);
      return new Promise((resolve, reject) => {
        const s = { at: this.t + Math.max(d, 0), seq: this.seq++, resolve };
        this.sleepers.push(s);
        signal?.addEventListener('abort', () => {
          this.sleepers = this.sleepers.filter((x) => x !== s);
          reject(signal.reason);
        }, { once: true });
      });
    };
  }

  /** Runs `promises` to the end, moving time to the next wake-up whenever all are blocked. */
  async run(...promises) {
    let done = 0;
    const tracked = promises.map((p) => p.finally(() => { done += 1; }));
    while (done < promises.length) {
      for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
      if (this.sleepers.length) {
        this.sleepers.sort((a, b) => a.at - b.at || a.seq - b.seq);
        const s = this.sleepers.shift();
        this.t = Math.max(this.t, s.at);
        s.resolve();
      }
    }
    return Promise.all(tracked);
  }
}

export function rfc3339(unix) {
  return new Date(unix * 1000).toISOString().replace('.000Z', '+00:00');
}

export function error(code, fields = {}) {
  return { error: { message: code, type: 'rate_limit_error', code, param: null, ...fields } };
}

/**
 * Just enough of aigw for the pacer: one key with a requests-per-minute quota (answers carry the
 * quota headers, the reset reported `delay` seconds after the window's end), refusals of a
 * used-up quota, and scripted answers. `fetch` is its fetch function.
 */
export class SimGateway {
  constructor(vt, limit, delay = 90, window = 60) {
    Object.assign(this, { vt, limit, delay, window });
    this.used = new Map();
    this.calls = []; // [virtual time, status]
    this.quotaReads = 0;
    this.script = []; // [status, headers, body] answered first
    this.fetch = async (url, init = {}) => this.handle(new URL(url), init);
  }

  headers(remaining, reset, now) {
    const r = Math.max(remaining, 0);
    return {
      'x-aigw-quota-requests-limit': String(this.limit),
      'x-aigw-quota-requests-remaining': String(r),
      'x-aigw-quota-requests-reset': String(Math.trunc(reset)),
      'ratelimit-policy': `"apikey-requests-minute";q=${this.limit};w=${this.window}`,
      ratelimit: `"apikey-requests-minute";r=${r};t=${Math.ceil(reset - now)}`,
    };
  }

  handle(url, init) {
    const now = this.vt.wall();
    const start = Math.floor(now / this.window) * this.window;
    const reset = start + this.window + this.delay;
    const used = this.used.get(start) ?? 0;
    const json = (status, body, headers = {}) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
    if (url.pathname.endsWith('/v1/quota')) {
      this.quotaReads += 1;
      return json(200, { object: 'list', data: [{ subject: 'apikey', metric: 'requests', window: 'minute', mode: 'enforce',
        limit: this.limit, used, remaining: Math.max(this.limit - used, 0), reset_at: rfc3339(reset) }] });
    }
    if (this.script.length) {
      const [status, headers, body] = this.script.shift();
      this.calls.push([this.vt.t, status]);
      return json(status, body, headers);
    }
    if (used >= this.limit) {
      this.calls.push([this.vt.t, 429]);
      return json(429, error('quota_exceeded', { subject: 'apikey', metric: 'requests', window: 'minute', limit: this.limit, used, reset_at: rfc3339(reset) }),
        { ...this.headers(0, reset, now), 'x-should-retry': 'false', 'x-aigw-error-source': 'gateway' });
    }
    this.used.set(start, used + 1);
    this.calls.push([this.vt.t, 200]);
    return json(200, { id: 'chatcmpl-1', object: 'chat.completion', created: 0, model: 'm',
      choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'hi' } }],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }, this.headers(this.limit - used - 1, reset, now));
  }
}

export function chat(f, { key = 'sk-aigw-test', model = 'm', base = 'http://gw.test/v1', headers = {}, signal } = {}) {
  return f(`${base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
    signal,
  });
}
