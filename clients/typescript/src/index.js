// Pacing and retries for apps that call aigw through the official `openai` npm SDK:
//
//   import OpenAI from 'openai';
//   import { pacedFetch } from 'aigw-client';
//   const client = new OpenAI({ baseURL: 'http://127.0.0.1:4000/v1', apiKey, maxRetries: 0, fetch: pacedFetch() });
//
// Calls on one key are spread so that each quota lasts until its window ends; refusals are waited
// out as the gateway says (or with full-jitter backoff) within `mostWait` seconds, else passed on
// at once as final, with the time to come back (`retryAt`).

export { pacedFetch, sleep } from './fetch.js';
export { Pacer, DEFAULTS } from './pacer.js';
export { retryAt } from './retry-at.js';
export { classify, parseStanding, parseWait } from './signals.js';
