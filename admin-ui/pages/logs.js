// Logs: every request the gateway answered (except circuit-broken ones) with filters, the
// status explanation (who answered — Gateway or Upstream — and by which rule), attempts,
// tokens, credits, latency, a detail view (each attempt with the provider's own words, masked)
// and a CSV export of the same filters. A request is found by its x-request-id; Errors only
// leaves out what succeeded.

import { api } from '../api.js';
import {
  h, clear, table, breakable, badge, alertBox, messageOf, fmtNum, fmtCredits, fmtTime, fmtRecent, dialog, field, select, handleSubmit, toast, busy, pageHeader,
} from '../ui.js';
import { ruleText } from './upstreams.js';

const RANGES = [
  ['1h', 'Last hour', 3600e3],
  ['24h', 'Last 24 hours', 24 * 3600e3],
  ['7d', 'Last 7 days', 7 * 24 * 3600e3],
  ['30d', 'Last 30 days', 30 * 24 * 3600e3],
  ['custom', 'Custom…', 0],
];

const SOURCE_NAMES = { gateway: 'Gateway', upstream: 'Upstream' };

const logCredits = (l) => fmtCredits(l.credits ?? null);
const ms = (v) => (v === null || v === undefined ? '—' : `${fmtNum(v)} ms`);

function statusBadge(l) {
  const s = Number(l.status);
  const kind = s < 400 ? 'ok' : s === 429 ? 'warn' : 'danger';
  return badge(String(l.status), kind);
}

function sourceText(l) {
  if (!l.source) return Number(l.status) < 400 ? 'Upstream' : '—';
  return SOURCE_NAMES[l.source] || l.source;
}

/** Turns the filter form into API query parameters. */
function queryOf(fd) {
  const q = {};
  const range = fd.get('range');
  if (range === 'custom') {
    const from = fd.get('from') ? new Date(fd.get('from')).getTime() : '';
    const to = fd.get('to') ? new Date(fd.get('to')).getTime() : '';
    q.from = from; q.to = to;
  } else {
    const r = RANGES.find(([k]) => k === range);
    q.from = Date.now() - r[2];
  }
  for (const k of ['request_id', 'key_id', 'member_id', 'model', 'status', 'source', 'tag', 'end_user']) {
    const v = (fd.get(k) || '').trim();
    if (v) q[k] = v;
  }
  if (fd.get('errors') === 'on') q.errors = true;
  // One request by its id: wherever it is in time.
  if (q.request_id) { delete q.from; delete q.to; }
  return q;
}

function attemptsOf(l) {
  const raw = l.attempts_detail;
  if (!raw) return [];
  try {
    const v = typeof raw === 'string' ? JSON.parse(raw) : raw;
    return Array.isArray(v) ? v : [v];
  } catch {
    return [{ detail: String(raw) }];
  }
}

/** One attempt in words: credential, model, what came back, the rule and the lock it wrote, and
 * the provider's own words (masked by the gateway). */
function attemptItem(a) {
  const outcome = a.status ? `HTTP ${a.status}` : (a.error ? 'no answer' : 'not sent');
  const ok = a.status && a.status < 400;
  return h('li.attempt',
    h('div.attempt-head',
      badge(outcome, ok ? 'ok' : 'danger'), ' ',
      h('strong', a.credential || `upstream #${a.credential_id}`),
      a.provider ? h('span.muted', ` (${a.provider})`) : null,
      ` · ${a.model || '—'}`,
      a.translated ? h('span.muted', ` · translated ${a.translated}`) : null),
    a.rule ? h('div.attempt-rule', ruleText(a.rule), a.lock_until ? [' — parked until ', h('time', { datetime: a.lock_until }, fmtTime(a.lock_until))] : null) : null,
    a.message ? h('blockquote.said', { title: 'The provider\'s own words (secrets masked)' }, h('span.said-who', 'Provider said: '), a.message) : null,
    a.error ? h('div.attempt-error', h('span.muted', 'Gateway saw: '), a.error) : null);
}

async function showDetail(row, names) {
  let l = row;
  try { l = await api.get(`/logs/${encodeURIComponent(row.request_id)}`); } catch { /* keep the row we have */ }
  const attempts = attemptsOf(l);
  await dialog(`Request ${l.request_id}`, (close) => [
    h('p', statusBadge(l), ' ', h('strong', l.code || (Number(l.status) < 400 ? 'success' : 'error')), ` — answered by ${sourceText(l)}`),
    l.explanation ? alertBox(Number(l.status) < 400 ? 'info' : 'warn', l.explanation) : null,
    h('dl.kv',
      h('dt', 'Time'), h('dd', fmtTime(l.ts)),
      h('dt', 'Endpoint'), h('dd', h('code', l.endpoint || '—')),
      h('dt', 'Key'), h('dd', names.key(l.key_id)),
      h('dt', 'Member'), h('dd', names.member(l.member_id)),
      h('dt', 'Model asked / served'), h('dd', `${l.model_requested || '—'} / ${l.model_served || '—'}`),
      h('dt', 'Upstream'), h('dd', names.upstream(l.upstream_id)),
      h('dt', 'Streamed'), h('dd', l.stream ? 'yes' : 'no'),
      h('dt', 'Client address'), h('dd', l.client_ip || '—'),
      h('dt', 'Tags'), h('dd', l.tags ? h('code', l.tags) : '—'),
      h('dt', 'End user'), h('dd', l.end_user || '—'),
      h('dt', 'Tokens'), h('dd', `${fmtNum(l.prompt_tokens)} prompt + ${fmtNum(l.completion_tokens)} completion = ${fmtNum(l.total_tokens)}${l.usage_estimated ? ' (estimated)' : ''}`),
      h('dt', 'Credits'), h('dd', logCredits(l)),
      h('dt', 'Latency'), h('dd', `${ms(l.latency_ms)} total, ${ms(l.ttfb_ms)} to first byte, ${ms(l.upstream_latency_ms)} upstream`),
      l.would_refuse ? [h('dt', 'Shadow guardrail'), h('dd', typeof l.would_refuse === 'string' ? l.would_refuse : 'a shadow guardrail would have refused this request')] : null),
    h('h3', `Attempts (${l.attempts ?? attempts.length})`),
    attempts.length
      ? [h('ol.attempts', attempts.map(attemptItem)),
        h('details', h('summary', 'As recorded (JSON)'), h('pre', JSON.stringify(attempts, null, 2)))]
      : h('p.muted', 'No upstream was called.'),
    h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Close')),
  ], { wide: true });
}

export default {
  title: 'Logs',
  async render(main, ctx) {
    const admin = ctx.role !== 'member';
    const [keys, members, models, ups] = await Promise.all([
      api.list('/keys').catch(() => []),
      admin ? api.list('/members').catch(() => []) : Promise.resolve([]),
      api.list('/models').catch(() => []),
      admin ? api.list('/upstreams').catch(() => []) : Promise.resolve([]),
    ]);
    const keyName = Object.fromEntries(keys.map((k) => [k.id, admin && k.member_email ? `${k.member_email}/${k.name}` : k.name]));
    const memberName = Object.fromEntries(members.map((m) => [m.id, m.email]));
    if (!admin) memberName[ctx.me.id] = ctx.me.email;
    const upName = Object.fromEntries(ups.map((u) => [u.id, u.name]));
    const names = {
      key: (id) => (id ? keyName[id] || `key #${id}` : '—'),
      member: (id) => (id ? memberName[id] || `member #${id}` : '—'),
      upstream: (id) => (id ? upName[id] || `upstream #${id}` : '—'),
    };

    const range = select('range', RANGES.map(([k, t]) => [k, t]), '24h');
    const from = h('input', { type: 'datetime-local', name: 'from' });
    const to = h('input', { type: 'datetime-local', name: 'to' });
    const custom = h('div.custom-range', field('From (your local time)', from), field('To (your local time)', to));
    const syncRange = () => { custom.hidden = range.value !== 'custom'; from.disabled = to.disabled = custom.hidden; };
    range.addEventListener('change', syncRange);
    syncRange();

    const filters = h('form.filters', { 'aria-label': 'Log filters' },
      field('Request ID', h('input', { name: 'request_id', autocomplete: 'off', spellcheck: false, placeholder: 'x-request-id', title: 'The x-request-id header of a response', value: ctx.params.get('request_id') || '' })),
      field('Time', range),
      custom,
      field('Key', select('key_id', [['', 'Any key'], ...keys.map((k) => [k.id, keyName[k.id]])], ctx.params.get('key_id') || '')),
      admin ? field('Member', select('member_id', [['', 'Any member'], ...members.map((m) => [m.id, m.email])], ctx.params.get('member_id') || '')) : null,
      field('Model', select('model', [['', 'Any model'], ...models.map((m) => [m.name, m.name])], ctx.params.get('model') || '')),
      field('Status', h('input', { name: 'status', type: 'number', min: 100, max: 599, inputmode: 'numeric', placeholder: 'e.g. 429', value: ctx.params.get('status') || '' })),
      field('Source', select('source', [['', 'Any source'], ['gateway', 'Gateway'], ['upstream', 'Upstream']], ctx.params.get('source') || '')),
      field('Tag', h('input', { name: 'tag', autocomplete: 'off', placeholder: 'e.g. team=search', value: ctx.params.get('tag') || '' })),
      field('End user', h('input', { name: 'end_user', autocomplete: 'off', placeholder: 'any', value: ctx.params.get('end_user') || '' })),
      h('div.field.checkbox.filter-check', h('label', h('input', { type: 'checkbox', name: 'errors', checked: ctx.params.get('errors') === 'true' }), ' Errors only')),
      h('div.filter-actions', h('button.primary', { type: 'submit' }, 'Apply filters')));

    const exportBtn = h('button', { type: 'button' }, 'Export CSV');
    const refreshBtn = h('button', { type: 'button' }, 'Refresh');
    const body = h('div', { 'aria-live': 'polite' }, h('p.loading', 'Loading logs…'));
    const more = h('div.more');
    clear(main, pageHeader('Logs', refreshBtn, exportBtn),
      h('p.muted', admin ? 'Every request in the workspace. Prompts and completions are never stored.' : 'Your requests. Prompts and completions are never stored.'),
      filters, body, more);

    let rows = [];
    let query = {};
    const render = () => {
      // What happened and its figures (tokens, credits, latency) fit at 1280 px; tags and end
      // users show on wide screens (col-wide), and only when a row on the page has some. On
      // phones each row is a short card.
      const labelled = rows.some((l) => l.tags || l.end_user);
      clear(body, table([
        { label: 'Time', class: 'c-time nowrap', cell: (l) => h('time', { datetime: l.ts, title: fmtTime(l.ts) }, fmtRecent(l.ts)) },
        {
          label: 'Status',
          class: 'c-status',
          cell: (l) => [statusBadge(l), ' ', h('span.source', { dataset: { source: l.source || '' } }, sourceText(l)), l.code ? h('small.code', breakable(l.code)) : null],
        },
        {
          label: 'Explanation',
          class: 'c-expl',
          cell: (l) => {
            const text = l.explanation || (Number(l.status) < 400 ? 'Served' : '—');
            return h('span.clamp', { title: text }, text);
          },
        },
        {
          label: 'Model / key',
          class: 'c-model',
          cell: (l) => [
            h('span.log-model', breakable(l.model_served && l.model_served !== l.model_requested ? `${l.model_requested} → ${l.model_served}` : l.model_requested || '—')),
            h('small.log-key', breakable(names.key(l.key_id)))],
        },
        labelled ? { label: 'Tags / end user', class: 'c-tags col-wide', cell: (l) => [l.tags ? h('code.tags', breakable(l.tags)) : h('span.muted', '—'), l.end_user ? [h('br'), h('small', breakable(l.end_user))] : null] } : null,
        {
          label: 'Tokens / credits',
          class: 'c-num c-fig c-usage',
          cell: (l) => [
            h('span.log-tokens', { title: l.usage_estimated ? 'Estimated: the upstream reported no usage' : 'Total tokens' }, `${fmtNum(l.total_tokens)}${l.usage_estimated ? '*' : ''}`),
            h('small.log-credits', { title: 'Credits' }, logCredits(l))],
        },
        { label: 'Latency', class: 'c-num c-fig c-latency nowrap', cell: (l) => ms(l.latency_ms) },
        { label: 'Details', class: 'c-details', cell: (l) => h('button.small', { type: 'button', 'aria-label': `Details of request ${l.request_id}`, onclick: () => showDetail(l, names) }, 'Details') },
      ].filter(Boolean), rows, { empty: 'No request matches these filters.', caption: 'Request logs', kind: 'log-table' }));
    };

    const load = async (cursor) => {
      try {
        const r = await api.get('/logs', { ...query, cursor, limit: 50 });
        rows = cursor ? rows.concat(r.data || []) : (r.data || []);
        render();
        clear(more, r.next_cursor
          ? h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, () => load(r.next_cursor)) }, 'Load more')
          : (rows.length ? h('small.muted', `${rows.length} request${rows.length === 1 ? '' : 's'} shown.`) : null));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
        clear(more);
      }
    };

    handleSubmit(filters, {
      validate: (fd) => {
        const errors = {};
        const tag = (fd.get('tag') || '').trim();
        if (tag && !/^[a-z0-9_.-]{1,64}=[^,]{1,128}$/.test(tag)) errors.tag = 'Write one tag as key=value, e.g. team=search.';
        if (fd.get('range') === 'custom') {
          if (!fd.get('from')) errors.from = 'Choose where the range starts.';
          if (fd.get('from') && fd.get('to') && new Date(fd.get('from')) >= new Date(fd.get('to'))) errors.to = 'The end must be after the start.';
        }
        return errors;
      },
      send: async (fd) => { query = queryOf(fd); await load(); },
    });
    refreshBtn.addEventListener('click', (e) => busy(e.currentTarget, async () => { query = queryOf(new FormData(filters)); await load(); }));
    exportBtn.addEventListener('click', (e) => busy(e.currentTarget, async () => {
      const q = queryOf(new FormData(filters));
      await api.download('/logs/export', q, `aigw-logs-${new Date().toISOString().slice(0, 19).replace(/[:T]/g, '-')}.csv`);
      toast('CSV downloaded.');
    }));
    query = queryOf(new FormData(filters));
    await load();
  },
};
