/** How patient a client is (seconds). Every wait of one call, pacing and retries together, stays
 * within `mostWait`; a call that would have to wait longer fails at once, saying when to come back. */
export interface Settings {
  /** Seconds one call may spend waiting in all, pacing and retries together (60). */
  mostWait?: number;
  /** Attempts per call, the first included (4). */
  maxAttempts?: number;
  /** Full-jitter backoff when a refusal names no wait: random × min(backoffCap, backoffBase × 2^(attempt−1)) (0.5, 8). */
  backoffBase?: number;
  backoffCap?: number;
  /** After a named wait, a random extra up to extraBase + extraShare × wait, at most extraCap (0.25, 0.1, 5). */
  extraBase?: number;
  extraShare?: number;
  extraCap?: number;
  /** Seconds after a quota window's end before the next window's allowance is used (1). */
  clockMargin?: number;
  /** How much later than a window's real end the gateway reports the reset (60; 0: pace until the reset itself). */
  resetDelay?: number;
  /** A scope closed with no known end lets one call through after this many seconds (60). */
  recheck?: number;
  /** The rate learned from an upstream's refusals grows back by its own size over this many seconds (10). */
  rateGrowth?: number;
  /** Calls per second below which refusals do not push the learned rate, unless the upstream itself let fewer through (1). */
  minRate?: number;
  /** Read `GET /v1/quota` before the first call of a key (true). */
  prime?: boolean;
}

export interface PacedFetchOptions extends Settings {
  /** Share one pacer between several fetches (then give no settings). */
  pacer?: Pacer;
  /** The fetch that really sends (default: the global fetch). */
  fetch?: typeof fetch;
  /** Sleeps `seconds`, rejecting when `signal` aborts (injected by tests). */
  sleep?: (seconds: number, signal?: AbortSignal) => Promise<void>;
  /** Unix seconds now (injected by tests). */
  wall?: () => number;
}

/** One quota's standing as an answer reports it. */
export interface Reading {
  /** `requests`, `tokens` (the `total_tokens` policy, under either header name), `prompt_tokens`, `completion_tokens` or `credits`. */
  metric: string;
  limit: number;
  remaining: number;
  /** Unix seconds of the reported reset; undefined: never resets. */
  reset?: number;
  /** The window's length in seconds, when known. */
  window?: number;
  /** `<subject>-<metric>-<window>`, as in `RateLimit-Policy`, when known. */
  name?: string;
  /** Whether `reset` is the gateway's (reported a minute or two after the window's real end). */
  delayed: boolean;
}

/** What to do after an answer. */
export interface Verdict {
  /** `ok` (pass it on), `retry` (after `wait`, or a backoff when undefined), `final`. */
  kind: 'ok' | 'retry' | 'final';
  /** Seconds the answer asks to wait, if it names a wait. */
  wait?: number;
  /** Unix seconds when calling again makes sense, if known. */
  retryAt?: number;
  code?: string;
  /** `key`: about the gateway key; `model`: about the model's upstream credentials. */
  scope: 'key' | 'model';
  /** Later calls in the scope are answered without being sent until `retryAt`. */
  close: boolean;
  forever: boolean;
}

export interface LocalRefusal {
  status: number;
  headers: [string, string][];
  body: string;
  retryAt?: number;
}

export interface Ticket {
  key: string;
  model?: string;
  quotaSlot: number;
  start: number;
  sentAt?: number;
  done: boolean;
  /** When the pacer gave it its turn (monotonic seconds). */
  plannedAt?: number;
}

export interface Plan {
  kind: 'go' | 'prime' | 'poll' | 'refuse';
  wait: number;
  ticket?: Ticket;
  refusal?: LocalRefusal;
}

export declare const DEFAULTS: Readonly<Required<Settings>>;

/** The pacing and retry decisions for every key used through one fetch (or shared by several). */
export declare class Pacer {
  constructor(settings?: Settings, time?: { clock?: () => number; wall?: () => number; random?: () => number });
  readonly settings: Required<Settings>;
  plan(key: string, model: string | undefined, allowance: number): Plan;
  sent(ticket: Ticket): void;
  cancel(ticket: Ticket): void;
  observe(ticket: Ticket, status: number, headers: Headers | Record<string, string>, body?: unknown,
    rawHeaders?: [string, string][], rawBody?: string): Verdict;
  retryDelay(verdict: Pick<Verdict, 'wait'>, attempt: number): number;
  primed(key: string, rows: unknown[] | undefined): void;
}

/** A `fetch` whose calls are paced, for `new OpenAI({ fetch: pacedFetch(), maxRetries: 0 })`. */
export declare function pacedFetch(options?: PacedFetchOptions): typeof fetch & { pacer: Pacer };

/** When calling again makes sense (Unix seconds) for an SDK error or a Response; undefined if not known. */
export declare function retryAt(errorOrResponse: { headers?: Headers; error?: unknown }): number | undefined;

export declare function sleep(seconds: number, signal?: AbortSignal): Promise<void>;
export declare function classify(status: number, headers: Headers | Record<string, string>, body: unknown, now: number): Verdict;
export declare function parseStanding(headers: Headers | Record<string, string>, now: number): Reading[];
export declare function parseWait(headers: Headers | Record<string, string>, now: number): number | undefined;
