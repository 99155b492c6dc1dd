// The one wrapper around fetch: adds the session token, sends and reads JSON, and turns every
// failure into an ApiError whose message is the API's own error.message (or a plain sentence
// when the gateway could not be reached or did not answer JSON).

const BASE = '/admin/v1';
const TOKEN_KEY = 'aigw.console.token';

export class ApiError extends Error {
  constructor(message, { status = 0, code = null, type = null, param = null } = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.type = type;
    this.param = param;
  }
}

export const session = {
  get token() { return sessionStorage.getItem(TOKEN_KEY); },
  set(token) { sessionStorage.setItem(TOKEN_KEY, token); },
  clear() { sessionStorage.removeItem(TOKEN_KEY); },
};

/** Called when the API says the token is no longer valid (set by the app shell). */
let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

/** Builds `path?query` leaving out empty values. */
export function withQuery(path, query = {}) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== undefined && v !== null && v !== '') params.set(k, String(v));
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

const STATUS_TEXT = {
  400: 'The request was not valid',
  401: 'You are not signed in',
  403: 'You are not allowed to do this',
  404: 'Not found',
  409: 'This conflicts with something that already exists',
  422: 'A field has an invalid value',
  429: 'Too many requests; try again shortly',
  500: 'The gateway hit an internal error',
  502: 'The gateway could not be reached',
  503: 'The gateway is not ready',
};

async function errorFrom(res) {
  let body = null;
  try { body = await res.json(); } catch { /* not JSON */ }
  const e = body && typeof body === 'object' ? body.error : null;
  const fallback = `${STATUS_TEXT[res.status] || 'The request failed'} (HTTP ${res.status})`;
  if (e && typeof e === 'object') {
    return new ApiError(e.message || fallback, { status: res.status, code: e.code, type: e.type, param: e.param });
  }
  if (typeof e === 'string') return new ApiError(e, { status: res.status });
  return new ApiError(fallback, { status: res.status });
}

/** Sends a request to the admin API; resolves to the parsed JSON (or null for 204). */
export async function request(path, { method = 'GET', body, query, raw = false } = {}) {
  const headers = { Accept: raw ? '*/*' : 'application/json' };
  const token = session.token;
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(BASE + withQuery(path, query), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch {
    throw new ApiError('Cannot reach the gateway. Check that it is running and try again.');
  }
  if (!res.ok) {
    const err = await errorFrom(res);
    if (res.status === 401 && token && path !== '/auth/login') onUnauthorized(err);
    throw err;
  }
  if (raw) return res;
  if (res.status === 204) return null;
  const text = await res.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError('The gateway answered something that is not JSON.', { status: res.status });
  }
}

export const api = {
  get: (path, query) => request(path, { query }),
  post: (path, body = {}) => request(path, { method: 'POST', body }),
  patch: (path, body) => request(path, { method: 'PATCH', body }),
  del: (path) => request(path, { method: 'DELETE' }),
  /** A list endpoint's `data` array, every page of it (following `next_cursor`). */
  list: async (path, query = {}) => {
    const all = [];
    let cursor;
    do {
      // After a first page of the default size, the rest in pages of the most a page holds.
      const r = await request(path, { query: cursor === undefined ? query : { ...query, cursor, limit: 1000 } });
      if (Array.isArray(r)) return r;
      all.push(...(r && Array.isArray(r.data) ? r.data : []));
      cursor = r && r.next_cursor != null ? r.next_cursor : undefined;
    } while (cursor !== undefined);
    return all;
  },
  /** Downloads a file answer (CSV export) as a blob, with the token. */
  download: async (path, query, filename) => {
    const res = await request(path, { query, raw: true });
    const blob = await res.blob();
    const url = URL.createObjectURL(blob);
    const a = document.createElement('a');
    a.href = url;
    a.download = filename;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
    return blob;
  },
};
