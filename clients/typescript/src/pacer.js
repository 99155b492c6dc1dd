// The pacing and retry decisions, shared by every call through one fetch: no I/O, no sleeping.
//
// Per gateway key, the pacer keeps the quota standing the last answers reported and hands out
// start times so that what remains of each quota lasts until its window ends: one call every
// `time left / calls left`, spread, not burst-then-stop. Per key and model it keeps what refusals
// said: a named wait holds every call of that scope until it has passed (plus a small random
// extra per call), and the rate at which the upstream let calls through before it refused spaces
// the calls after the wait. A refusal that must not be retried (a used-up quota, a banned key, a
// wait past `mostWait`) closes its scope: later calls are refused at once, without being sent,
// with the same answer and the time to come back. The same rules as the Python package.

import { GATEWAY_RESET_DELAY_MIN, classify, metricName, parseRfc3339, parseStanding, windowSeconds } from './signals.js';

/** @type {Required<import('./index.js').Settings>} */
export const DEFAULTS = Object.freeze({
  mostWait: 60,
  maxAttempts: 4,
  backoffBase: 0.5,
  backoffCap: 8,
  extraBase: 0.25,
  extraShare: 0.1,
  extraCap: 5,
  clockMargin: 1,
  resetDelay: GATEWAY_RESET_DELAY_MIN,
  recheck: 60,
  rateGrowth: 10,
  minRate: 1,
  prime: true,
});

/** How often calls waiting for another call's quota read look again, in seconds. */
export const POLL = 0.05;

/** Index of the first element >= x in a sorted array. */
function bisectLeft(a, x) {
  let lo = 0;
  let hi = a.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function newKey() {
  return { budgets: new Map(), slots: [], tat: 0, hold: 0, holdWait: 0, closed: undefined,
    primed: undefined, primeAsked: -Infinity, models: new Map() };
}

// Per key and model: the hold a refusal named; the current cycle (since the last refusal): its
// start and the calls sent in it that were served; when calls could go again after the last
// refusal's wait; the cycle a refusal ended ([its start, when calls could go in it, its end, the
// wait the refusal named]), the calls sent in it that were served (answers still coming in after
// the refusal count), and the rate learned before it.
function newModel() {
  return { hold: 0, holdWait: 0, tat: 0, cycleStart: undefined, served: 0, lastRefusal: -Infinity,
    resume: -Infinity, prev: undefined, prevServed: 0, before: undefined, closed: undefined };
}

/**
 * The rate the upstream let through over the last cycle a refusal ended: the calls it served over
 * the time calls could go and the wait it asked for; never less than half the rate learned before
 * (one cut at most halves it), nor than `floor` when the rate learned before was at least that.
 */
function baseRate(ms, floor = 0) {
  if (!ms.prev) return undefined;
  const [, going, end, wait] = ms.prev;
  let rate = ms.prevServed / Math.max(end - going + wait, 1e-3);
  if (ms.before) rate = Math.max(rate, ms.before / 2, Math.min(ms.before, floor));
  return rate || undefined;
}

export class Pacer {
  /**
   * @param {import('./index.js').Settings} [settings]
   * @param {{clock?: () => number, wall?: () => number, random?: () => number}} [time]
   *   `clock` monotonic seconds, `wall` Unix seconds, `random` in [0, 1): injected by tests.
   */
  constructor(settings = {}, time = {}) {
    this.settings = { ...DEFAULTS, ...settings };
    if (this.settings.maxAttempts < 1) throw new RangeError('maxAttempts must be at least 1');
    if (this.settings.mostWait < 0) throw new RangeError('mostWait must not be negative');
    if (this.settings.minRate < 0) throw new RangeError('minRate must not be negative');
    this.clock = time.clock ?? (() => performance.now() / 1000);
    this.wall = time.wall ?? (() => Date.now() / 1000);
    this.random = time.random ?? Math.random;
    /** @type {Map<string, ReturnType<typeof newKey>>} */
    this.keys = new Map();
  }

  monoOf(unix) {
    return this.clock() + (unix - this.wall());
  }

  /** A window's real end (Unix seconds) from the reset the gateway reports. */
  realEnd(reset) {
    const d = this.settings.resetDelay;
    return d <= 0 ? reset : Math.floor((reset - d) / 60) * 60;
  }

  key(k) {
    let ks = this.keys.get(k);
    if (!ks) this.keys.set(k, (ks = newKey()));
    return ks;
  }

  model(ks, m) {
    if (m === undefined) return undefined;
    let ms = ks.models.get(m);
    if (!ms) ks.models.set(m, (ms = newModel()));
    return ms;
  }

  /**
   * When the next attempt of a call on `key` for `model` may start, if it may wait at most
   * `allowance` seconds more.
   * @returns {import('./index.js').Plan}
   */
  plan(key, model, allowance) {
    const s = this.settings;
    const now = this.clock();
    const ks = this.key(key);
    const ms = this.model(ks, model);
    for (const closed of [ks.closed, ms?.closed]) {
      const refusal = this.stillClosed(closed, now);
      if (refusal) return { kind: 'refuse', wait: 0, refusal };
    }
    if (s.prime && ks.primed !== 'done') {
      // One call reads the key's quotas; the others look again shortly (or go unpaced when they
      // cannot wait even that long).
      if (ks.primed === undefined || now - ks.primeAsked > 5) {
        ks.primed = 'reading';
        ks.primeAsked = now;
        return { kind: 'prime', wait: 0 };
      }
      if (allowance >= POLL) return { kind: 'poll', wait: POLL };
    }
    const q = this.quotaSlot(ks, now, Math.max(now, ks.tat));
    if (q.usedUp) return { kind: 'refuse', wait: 0, refusal: q.usedUp };
    if (q.stale && s.prime) {
      // A window passed whose length is unknown: read the quotas again first.
      ks.primed = 'reading';
      ks.primeAsked = now;
      return { kind: 'prime', wait: 0 };
    }
    let slot = q.slot;
    let paced = true;
    let [scheduled, holdWait] = this.held(ks, ms, slot, now, true);
    if (scheduled - now > allowance && slot > now) {
      // Pacing is a preference, a quota is a limit: a call that cannot wait for its paced turn
      // goes as early as the quota has room for it rather than fail (the calls already planned
      // keep their slots; the pace goes on after them).
      const early = this.quotaSlot(ks, now, now).slot;
      if (early < slot) {
        slot = early;
        paced = false;
        [scheduled, holdWait] = this.held(ks, ms, slot, now, false);
      }
    }
    // The random extra after a hold is this call's own: it does not delay the others.
    const start = scheduled + (holdWait > 0 ? this.extra(holdWait) : 0);
    const wait = start - now;
    if (wait > allowance) return { kind: 'refuse', wait: 0, refusal: this.tooLong(wait) };
    if (paced) ks.tat = slot + q.interval;
    ks.slots.splice(bisectLeft(ks.slots, slot), 0, slot);
    if (ms) {
      const rate = this.rate(ms, now);
      const after = scheduled + (rate ? 1 / rate : 0);
      ms.tat = paced ? after : Math.max(ms.tat, after);
      if (ms.cycleStart === undefined) ms.cycleStart = now;
    }
    return { kind: 'go', wait: Math.max(wait, 0), ticket: { key, model, quotaSlot: slot, start, sentAt: undefined, done: false, plannedAt: now } };
  }

  /**
   * When a call whose quota slot is `slot` may start given the holds named by refusals and the
   * rate the upstream let through, and the wait of the hold it is under. A call out of its paced
   * turn follows the calls planned before it only where an upstream's rate spaces them.
   */
  held(ks, ms, slot, now, inTurn) {
    let start = Math.max(slot, ks.hold);
    let holdWait = now < ks.hold ? ks.holdWait : 0;
    if (ms) {
      if (now < ms.hold) holdWait = Math.max(holdWait, ms.holdWait);
      start = Math.max(start, ms.hold);
      if (inTurn || this.rate(ms, now)) start = Math.max(start, ms.tat);
    }
    return [start, holdWait];
  }

  stillClosed(c, now) {
    if (!c) return undefined;
    const open = c.forever || (c.until !== undefined && now < c.until) || (c.until === undefined && now - c.since < this.settings.recheck);
    if (!open) return undefined;
    const headers = c.headers.filter(([k]) => !['retry-after', 'retry-after-ms'].includes(k.toLowerCase()));
    if (c.until !== undefined) {
      const left = Math.max(c.until - now, 0);
      headers.push(['retry-after', String(Math.ceil(left))], ['retry-after-ms', String(Math.ceil(left * 1000))]);
    }
    return { status: c.status, headers: local(headers, c.retryAt), body: c.body, retryAt: c.retryAt };
  }

  /**
   * The earliest quota slot at or after `slot`, the spacing to the next one, whether a budget went
   * stale, and a refusal when a never-ending quota is used up.
   */
  quotaSlot(ks, now, slot) {
    const margin = this.settings.clockMargin;
    let stale = false;
    // Each move passes a window's end; the windows ahead are full only of planned calls.
    for (let pass = 0; pass < 100000; pass++) {
      let moved = false;
      for (const [id, b] of [...ks.budgets]) {
        const w = this.windowAt(b, slot);
        if (w.end === undefined && b.end !== undefined) {
          if (now >= b.end + margin) {
            // Past a window whose length is unknown: forget it until told again.
            ks.budgets.delete(id);
            stale = true;
          }
          continue;
        }
        if (w.end === undefined) {
          if (w.remaining <= 0) return { slot, interval: 0, stale, usedUp: this.usedUp(b) };
          continue;
        }
        const left = callsLeft(ks, b, w);
        // Used up (or about to be), or in the margin after its end: the next window.
        if ((left !== undefined && left < 1) || w.remaining <= 0 || slot >= w.end) {
          slot = w.end + margin;
          moved = true;
        }
      }
      if (!moved) break;
    }
    let interval = 0;
    for (const b of ks.budgets.values()) {
      const w = this.windowAt(b, slot);
      if (w.end === undefined) continue;
      const left = callsLeft(ks, b, w);
      if (left !== undefined && left >= 1) interval = Math.max(interval, (w.end - slot) / left);
    }
    return { slot, interval, stale, usedUp: undefined };
  }

  /**
   * A budget's window as it will stand at `t`: the window after the one last reported when that
   * one has ended and its length is known.
   */
  windowAt(b, t) {
    if (b.end === undefined) return { end: undefined, remaining: b.remaining, start: undefined };
    const margin = this.settings.clockMargin;
    if (t < b.end + margin) return { end: b.end, remaining: b.remaining, start: b.window ? b.end - b.window : -Infinity };
    if (!b.window) return { end: undefined, remaining: b.remaining, start: undefined };
    const k = Math.floor((t - b.end - margin) / b.window) + 1;
    const end = b.end + k * b.window;
    return { end, remaining: b.limit, start: end - b.window };
  }

  rate(ms, now) {
    const base = baseRate(ms, this.settings.minRate);
    if (base === undefined) return undefined;
    return base * (1 + Math.max(now - ms.lastRefusal, 0) / this.settings.rateGrowth);
  }

  extra(wait) {
    const s = this.settings;
    return this.random() * Math.min(s.extraCap, s.extraBase + s.extraShare * wait);
  }

  tooLong(wait) {
    const retryAt = this.wall() + wait;
    const secs = Math.ceil(wait);
    const body = errorBody(
      `aigw-client: the next call on this key may start in ${secs} s, later than mostWait (${this.settings.mostWait} s); it was not sent`,
      'wait_too_long', secs);
    const headers = [['retry-after', String(secs)], ['retry-after-ms', String(Math.ceil(wait * 1000))]];
    return { status: 429, headers: local(headers, retryAt), body, retryAt };
  }

  usedUp(b) {
    const body = errorBody(`aigw-client: the ${b.name ?? b.metric} quota (${b.limit}) is used up and never resets; it was not sent`, 'quota_exceeded');
    return { status: 429, headers: local([], undefined), body, retryAt: undefined };
  }

  /** The attempt went out now. */
  sent(ticket) {
    ticket.sentAt = this.clock();
  }

  /** The attempt was not sent, or its answer will not be reported. */
  cancel(ticket) {
    this.release(ticket);
  }

  release(ticket) {
    if (ticket.done) return undefined;
    ticket.done = true;
    const ks = this.keys.get(ticket.key);
    if (!ks) return undefined;
    const i = bisectLeft(ks.slots, ticket.quotaSlot);
    if (i < ks.slots.length && ks.slots[i] === ticket.quotaSlot) ks.slots.splice(i, 1);
    return ks;
  }

  /**
   * Learns from an answer and says what to do with it. `body` is the parsed JSON of an error
   * answer (undefined for a success); `rawHeaders` and `rawBody` are kept to answer later calls of
   * a scope this answer closes.
   * @returns {import('./index.js').Verdict}
   */
  observe(ticket, status, headers, body, rawHeaders = [], rawBody = '') {
    const now = this.clock();
    const unix = this.wall();
    const ks = this.release(ticket) ?? this.key(ticket.key);
    this.learnStanding(ks, parseStanding(headers, unix), false);
    const verdict = classify(status, headers, body, unix);
    const ms = this.model(ks, ticket.model);
    if (verdict.kind === 'ok') {
      if (ms) {
        // Credited to the cycle the call was sent in.
        const sent = ticket.sentAt ?? now;
        if (ms.cycleStart === undefined || sent >= ms.cycleStart) ms.served += 1;
        else if (ms.prev && sent >= ms.prev[0]) ms.prevServed += 1; // the cycle's start
      }
    } else if (verdict.kind === 'retry' && verdict.wait !== undefined) {
      this.hold(ks, ms, verdict, ticket, now);
    } else if (verdict.kind === 'final' && verdict.close) {
      const closure = { until: verdict.retryAt !== undefined ? this.monoOf(verdict.retryAt) : undefined, since: now,
        forever: verdict.forever, retryAt: verdict.retryAt, status, headers: [...rawHeaders], body: rawBody };
      if (verdict.scope === 'model' && ms) ms.closed = closure;
      else ks.closed = closure;
    }
    return verdict;
  }

  hold(ks, ms, v, ticket, now) {
    const wait = v.wait ?? 0;
    if (v.scope === 'model' && ms) {
      if (now + wait > ms.hold) {
        ms.hold = now + wait;
        ms.holdWait = wait;
      }
      // One cut per burst, as TCP cuts its window once per window of losses: only an attempt
      // given its turn after the last cut tells something new about the rate. The calls paced
      // before it (sent, or still waiting for their turn and sent into the same parked
      // credential, each refused with the few milliseconds left) do not cut again; their named
      // waits still hold the calls.
      const planned = ticket.plannedAt ?? ticket.sentAt ?? now;
      if (planned >= ms.lastRefusal) {
        ms.before = baseRate(ms, this.settings.minRate);
        const start = ms.cycleStart ?? now;
        ms.prev = [start, Math.max(start, ms.resume), now, wait];
        ms.prevServed = ms.served;
        ms.resume = now + wait;
        ms.cycleStart = now;
        ms.served = 0;
        ms.lastRefusal = now;
        ms.tat = Math.max(ms.tat, ms.hold);
      }
    } else if (now + wait > ks.hold) {
      ks.hold = now + wait;
      ks.holdWait = wait;
    }
  }

  /**
   * How long the call itself waits before its next attempt, after attempt number `attempt` (1 for
   * the first) got `verdict`: the named wait plus a small random extra, else full jitter.
   */
  retryDelay(verdict, attempt) {
    const s = this.settings;
    if (verdict.wait !== undefined) return verdict.wait + this.extra(verdict.wait);
    return this.random() * Math.min(s.backoffCap, s.backoffBase * 2 ** (attempt - 1));
  }

  /** The key's quotas as `GET /v1/quota` lists them (undefined: could not be read). */
  primed(key, rows) {
    const ks = this.key(key);
    ks.primed = 'done';
    const readings = [];
    for (const r of rows ?? []) {
      if (!r || typeof r !== 'object' || (r.mode ?? 'enforce') !== 'enforce') continue;
      const limit = Number(r.limit);
      const remaining = Number(r.remaining);
      if (!Number.isFinite(limit) || !Number.isFinite(remaining)) continue;
      // `tokens`, whichever name the gateway lists (`total_tokens` before seed 003's).
      readings.push({ metric: metricName(String(r.metric)), limit, remaining, reset: parseRfc3339(r.reset_at),
        window: windowSeconds(r.window), name: `${r.subject}-${r.metric}-${r.window}`, delayed: true });
    }
    this.learnStanding(ks, readings, true);
  }

  learnStanding(ks, readings, replace) {
    for (const r of readings) {
      const end = r.reset !== undefined ? this.monoOf(r.delayed ? this.realEnd(r.reset) : r.reset) : undefined;
      const [id, b] = match(ks, r);
      if (!b) {
        ks.budgets.set(id, { metric: r.metric, limit: r.limit, remaining: r.remaining, end, window: r.window, name: r.name, cost: undefined });
        continue;
      }
      if (r.window !== undefined) b.window = r.window;
      if (r.name !== undefined && b.name === undefined) b.name = r.name;
      const sameWindow = end !== undefined && b.end !== undefined && Math.abs(end - b.end) < 1;
      if (sameWindow && !replace) {
        if (b.metric !== 'requests' && r.remaining < b.remaining) {
          const sample = b.remaining - r.remaining;
          b.cost = b.cost === undefined ? sample : 0.7 * b.cost + 0.3 * sample;
        }
        // Answers may arrive out of order: within a window, the least remaining holds.
        b.remaining = Math.min(b.remaining, r.remaining);
        b.limit = r.limit;
      } else if (end === undefined || b.end === undefined || end >= b.end || replace) {
        b.remaining = r.remaining;
        b.limit = r.limit;
        b.end = end;
      }
    }
  }
}

function callsLeft(ks, b, w) {
  const perCall = b.metric === 'requests' ? 1 : b.cost;
  if (perCall === undefined || perCall <= 0) return undefined;
  const planned = bisectLeft(ks.slots, w.end) - bisectLeft(ks.slots, w.start);
  return w.remaining / perCall - planned;
}

function match(ks, r) {
  if (r.name !== undefined && ks.budgets.has(r.name)) return [r.name, ks.budgets.get(r.name)];
  for (const [id, b] of ks.budgets) {
    if (b.metric === r.metric && b.limit === r.limit && (r.name === undefined || b.name === undefined)) return [id, b];
  }
  // The tightest policy of a metric can change: the reading then describes another one.
  return [r.name ?? `${r.metric}:${r.limit}`, undefined];
}

function errorBody(message, code, retryAfter) {
  const error = { message, type: 'rate_limit_error', code, param: null };
  if (retryAfter !== undefined) error.retry_after = retryAfter;
  return JSON.stringify({ error });
}

/**
 * Headers of an answer given without sending: `x-aigw-error-source: client`, never to be retried
 * by the SDK, and the time to come back.
 */
export function local(headers, retryAt) {
  const drop = ['x-aigw-error-source', 'x-should-retry', 'x-aigw-client-retry-at', 'content-length', 'content-encoding', 'transfer-encoding'];
  const out = headers.filter(([k]) => !drop.includes(k.toLowerCase()));
  out.push(['x-aigw-error-source', 'client'], ['x-should-retry', 'false']);
  if (!out.some(([k]) => k.toLowerCase() === 'content-type')) out.push(['content-type', 'application/json']);
  if (retryAt !== undefined) out.push(['x-aigw-client-retry-at', String(Math.ceil(retryAt))]);
  return out;
}
