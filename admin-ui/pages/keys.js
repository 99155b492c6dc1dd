// API keys: create (the key is shown once, with a copy button), budgets on my own keys (an
// apikey guardrail), the models a key may call and its cap on requests in flight (set by a
// member on a new key of theirs, by owners and admins on any key), delete, and each key's
// breaker: trips, blocked-until countdown, banned. A key may expire (set when creating it, by
// owners and admins later): keys expiring within 7 days are marked. Rotate issues a new secret
// on the same key, shown once, while the old one works for a grace time.

import { api } from '../api.js';
import {
  h, clear, table, badge, managedBadge, MANAGED_TEXT, alertBox, messageOf, fmtNum, fmtTime, dateTime, countdown, dialog, confirmDialog,
  field, select, handleSubmit, toast, busy, pageHeader, secretDialog, metricLabel, windowLabel, bar, idle,
} from '../ui.js';
import { metricWindowFields, validatePolicy, windowValue, editPolicy, deletePolicy, createdText } from './guardrails.js';
import { limitsFields, validateLimits, limitsBody, limitsCell, editLimits } from './limits.js';

/** Keys expiring within this long are marked. */
const SOON_MS = 7 * 24 * 3600 * 1000;

/** The key's expiry: never, the date (marked when within 7 days or past), and the old secret's
 * grace end after a rotation. For owners and admins, the button that changes it. */
function expiryCell(k, edit) {
  const shown = expiryText(k);
  return edit
    ? h('button.link-button.expiry', { type: 'button', 'aria-label': `Expiry of key ${k.name}`, title: 'Change the expiry', onclick: () => edit(k) }, shown)
    : shown;
}

function expiryText(k) {
  const grace = k.previous_secret_expires_at
    ? [h('br'), h('small.muted', { title: fmtTime(k.previous_secret_expires_at) }, 'old secret ', countdown(k.previous_secret_expires_at, 'retired'))]
    : null;
  if (!k.expires_at) return [h('span.muted', 'never'), grace];
  const left = new Date(k.expires_at).getTime() - Date.now();
  const when = dateTime(k.expires_at, { seconds: false });
  let mark = null;
  if (k.expired || left <= 0) mark = badge('expired', 'danger', 'Requests with this key answer 401 api_key_expired');
  else if (left < SOON_MS) mark = badge('expires soon', 'warn', 'Expires within 7 days');
  return [when, mark ? [' ', mark] : null, grace];
}

/** A date-time typed in the form (local time) as RFC 3339, or null when blank. */
function expiryOf(fd) {
  const v = String(fd.get('expires_at') || '').trim();
  return v ? new Date(v).toISOString() : null;
}

const GRACES = [
  [0, 'At once'], [3600, '1 hour'], [86400, '24 hours'], [7 * 86400, '7 days'], [30 * 86400, '30 days'],
];

/** Asks for the grace and rotates `k`; resolves the key with its new secret, or nothing. */
function rotateKey(k) {
  return dialog(`Rotate key ${k.name}`, (close) => {
    const form = h('form.form',
      h('p', 'A new secret replaces this key\'s secret. Quotas, usage, breaker and logs stay with the key. Apps still using the old secret keep working until the grace time ends, then get 401.'),
      k.managed_by ? h('p.hint', MANAGED_TEXT) : null,
      field('Old secret keeps working', select('grace_seconds', GRACES.map(([v, label]) => [v, label]), 86400)),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Rotate key')));
    handleSubmit(form, {
      send: async (fd) => close(await api.post(`/keys/${k.id}/rotate`, { grace_seconds: Number(fd.get('grace_seconds')) })),
    });
    return form;
  });
}

/** Sets or clears `k`'s expiry (owners and admins); resolves true when saved. */
function editExpiry(k) {
  return dialog(`Expiry of key ${k.name}`, (close) => {
    const local = k.expires_at ? new Date(new Date(k.expires_at).getTime() - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 16) : '';
    const form = h('form.form',
      field('Expires at', h('input', { name: 'expires_at', type: 'datetime-local', value: local }), 'Your browser\'s local time; blank for never. A past time stops the key at once.'),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Save expiry')));
    handleSubmit(form, {
      send: async (fd) => { await api.patch(`/keys/${k.id}`, { expires_at: expiryOf(fd) }); close(true); },
    });
    return form;
  });
}

/** The breaker's state; the cell is the button that opens its history. */
function breakerCell(k) {
  const b = k.breaker || {};
  const trips = h('small.muted', `${b.trips || 0} trip${b.trips === 1 ? '' : 's'}`);
  let state;
  if (b.banned) state = [badge('banned', 'danger', 'Banned for good after 5 trips: delete it and create a new key'), ' ', trips];
  else if (b.blocked_until && new Date(b.blocked_until).getTime() > Date.now()) {
    state = [badge('blocked', 'warn'), h('br'), h('strong.nowrap', countdown(b.blocked_until, 'open again')), h('br'), trips];
  } else state = [badge('ok', 'ok'), ' ', trips];
  return h('button.link-button.breaker', { type: 'button', 'aria-label': `Breaker history of key ${k.name}`, title: 'Breaker history', onclick: () => breakerDialog(k) }, state);
}

async function createKey(ctx, members) {
  return dialog('New API key', (close) => {
    const name = h('input', { name: 'name', required: true, maxLength: 100, autocomplete: 'off', placeholder: 'e.g. ci, laptop, billing-service' });
    const fields = [field('Name', name, 'A name to recognise the key by; unique per member.')];
    if (ctx.role !== 'member' && members.length) {
      fields.push(field('For member', select('member_id', members.filter((m) => m.active !== false).map((m) => [m.id, m.email]), ctx.me.id)));
    }
    fields.push(...limitsFields({}, { who: 'key' }));
    fields.push(field('Expires at', h('input', { name: 'expires_at', type: 'datetime-local' }), 'Optional, in your browser\'s local time; blank for never.'));
    const form = h('form.form', ...fields,
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Create key')));
    handleSubmit(form, {
      validate: (fd) => {
        const v = fd.get('name').trim();
        if (!v) return { name: 'Give the key a name.' };
        if (v.includes('/')) return { name: 'A key name cannot contain "/".' };
        const exp = expiryOf(fd);
        if (exp && new Date(exp).getTime() <= Date.now()) return { expires_at: 'Choose a time in the future, or leave it blank.' };
        return validateLimits(fd);
      },
      send: async (fd) => {
        const body = { name: fd.get('name').trim() };
        const limits = limitsBody(fd);
        if (limits.allowed_models) body.allowed_models = limits.allowed_models;
        if (limits.max_in_flight) body.max_in_flight = limits.max_in_flight;
        if (limits.allowed_tags) body.allowed_tags = limits.allowed_tags;
        if (expiryOf(fd)) body.expires_at = expiryOf(fd);
        if (fd.get('member_id') && Number(fd.get('member_id')) !== ctx.me.id) body.member_id = Number(fd.get('member_id'));
        const created = await api.post('/keys', body);
        close(created);
      },
    });
    return form;
  });
}

/** Why a member may not change a budget: the API lets members change only the ones they set. */
const SET_OVER_YOU = 'Set by an owner or admin: only an owner or admin can change or delete it.';

async function budgetDialog(ctx, key, policies, reload) {
  await dialog(`Budget of key ${key.name}`, (close) => {
    const mine = policies.filter((p) => p.subject === 'apikey' && p.target_id === key.id);
    const readOnly = (p) => ctx.role === 'member' && p.created_by !== ctx.me.id;
    const list = mine.length
      ? h('ul.plain.budget-list', mine.map((p) => h('li',
        h('div', `${fmtNum(p.limit)} ${metricLabel(p.metric).toLowerCase()} ${windowLabel(p.window)}`, p.mode === 'shadow' ? [' ', badge('shadow', 'info')] : null),
        p.used !== null && p.used !== undefined ? [bar(Number(p.used), Number(p.limit)), h('small', `${fmtNum(p.used)} used`)] : null,
        readOnly(p)
          ? h('p.hint.read-only', SET_OVER_YOU)
          : h('div.row-actions',
            h('button.small', { type: 'button', onclick: async () => { close(); if (await editPolicy(p)) reload(); } }, 'Edit'),
            h('button.small.danger', { type: 'button', onclick: async () => { close(); try { if (await deletePolicy(p)) reload(); } catch (e) { toast(messageOf(e), 'error'); } } }, 'Delete')))))
      : h('p.empty', 'No budget on this key yet: only member, department and workspace guardrails apply.');
    const form = h('form.form', h('h3', 'Add a budget'), ...metricWindowFields({ metric: 'credits', window: 'month' }),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Close'), h('button.primary', { type: 'submit' }, 'Add budget')));
    handleSubmit(form, {
      validate: validatePolicy,
      send: async (fd) => {
        const created = await api.post('/policies', {
          subject: 'apikey', target_id: key.id, metric: fd.get('metric'), window: windowValue(fd), limit: Number(fd.get('limit')), mode: fd.get('mode'),
        });
        toast(createdText('Budget added', created));
        close();
        reload();
      },
    });
    return [list, form];
  }, { wide: true });
}

async function breakerDialog(key) {
  await dialog(`Breaker of key ${key.name}`, (close) => {
    const body = h('div', h('p.loading', 'Loading…'));
    api.get(`/keys/${key.id}/breaker`).then((b) => {
      clear(body,
        h('dl.kv',
          h('dt', 'Trips'), h('dd', String(b.trips)),
          h('dt', 'Banned'), h('dd', b.banned ? 'yes — delete the key and create a new one' : 'no'),
          h('dt', 'Blocked until'), h('dd', b.blocked_until ? [fmtTime(b.blocked_until), ' (', countdown(b.blocked_until, 'open again'), ')'] : 'not blocked')),
        h('p.hint', 'A key trips when more than 90 % of at least 100 requests failed within 60 s. Trips block it for 30 s, 2 min, 10 min, 12 h; the 5th trip bans it.'),
        table([
          { label: 'Trip', cell: (t) => String(t.trip) },
          { label: 'At', cell: (t) => fmtTime(t.at) },
          { label: 'Failed / requests', cell: (t) => `${fmtNum(t.failures)} / ${fmtNum(t.requests)}` },
          { label: 'Blocked until', cell: (t) => (t.banned ? 'banned' : fmtTime(t.blocked_until)) },
        ], b.history || [], { empty: 'This key never tripped.', caption: 'Trip history' }));
    }).catch((err) => clear(body, alertBox('error', messageOf(err))));
    return [body, h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Close'))];
  });
}

export default {
  title: 'API keys',
  async render(main, ctx) {
    const body = h('div', h('p.loading', 'Loading keys…'));
    const newBtn = h('button.primary', { type: 'button' }, 'New API key');
    clear(main,
      pageHeader('API keys', newBtn),
      h('p.muted', ctx.role === 'member'
        ? 'Your gateway keys. Apps send one as "Authorization: Bearer sk-aigw-…" to this gateway\'s /v1 API.'
        : 'Every gateway key in the workspace. Apps send one as "Authorization: Bearer sk-aigw-…" to this gateway\'s /v1 API.'),
      body);
    let members = [];
    let policies = [];

    const load = async () => {
      try {
        const [keys, pol] = await Promise.all([api.list('/keys'), api.list('/policies').catch(() => [])]);
        policies = pol;
        const budgets = (k) => policies.filter((p) => p.subject === 'apikey' && p.target_id === k.id);
        // The key's prefix goes under its name and the creation date shows on wide screens
        // only, so the budget keeps a line per budget.
        const cols = [
          { label: 'Name', cell: (k) => [h('strong', k.name), h('code.key-prefix', `${k.prefix || 'sk-aigw-'}…`), ' ', managedBadge(k)] },
        ];
        if (ctx.role !== 'member') cols.push({ label: 'Member', cell: (k) => k.member_email || String(k.member_id) });
        cols.push(
          { label: 'Created', class: 'nowrap col-wide', cell: (k) => h('span', { title: fmtTime(k.created_at) }, fmtTime(k.created_at).slice(0, 10)) },
          { label: 'Last used', class: 'nowrap', cell: (k) => (k.last_used_at ? dateTime(k.last_used_at, { seconds: false }) : 'never') },
          {
            label: 'Budget',
            class: 'c-budget',
            cell: (k) => {
              const b = budgets(k);
              if (!b.length) return h('span.muted', 'none');
              return h('ul.plain.budget-cell', b.map((p) => {
                const text = `${fmtNum(p.limit)} ${metricLabel(p.metric).toLowerCase()} ${windowLabel(p.window)}`;
                const known = p.used !== null && p.used !== undefined;
                return h('li', known ? bar(Number(p.used), Number(p.limit), `Budget ${text}`) : null,
                  h('span.budget-text', known ? `${fmtNum(p.used)} / ${text}` : text));
              }));
            },
          },
          { label: 'Limits', class: 'c-limits', cell: limitsCell },
          {
            label: 'Expires',
            class: 'c-expires',
            // Like the limits, an expiry is changed by owners and admins.
            cell: (k) => expiryCell(k, ctx.role !== 'member' && (async () => {
              if (await editExpiry(k)) { toast(`Key ${k.name}: expiry saved.`); load(); }
            })),
          },
          { label: 'Breaker', cell: breakerCell },
          {
            label: 'Actions',
            class: 'actions-cell key-actions',
            cell: (k) => [
              (ctx.role !== 'member' || k.created_by === ctx.me.id) // members budget only keys they created
                ? h('button.small', { type: 'button', 'aria-label': `Budget of key ${k.name}`, onclick: () => budgetDialog(ctx, k, policies, load) }, 'Budget') : null,
              ctx.role !== 'member' // a member sets a key's limits only when creating it
                ? h('button.small', {
                  type: 'button',
                  'aria-label': `Limits of key ${k.name}`,
                  onclick: async () => { if (await editLimits(k, { title: `Limits of key ${k.name}`, path: `/keys/${k.id}`, who: 'key', what: `Key ${k.name}` })) load(); },
                }, 'Limits') : null,
              h('button.small', {
                type: 'button',
                'aria-label': `Rotate key ${k.name}`,
                onclick: async () => {
                  const rotated = await rotateKey(k);
                  if (!rotated) return;
                  await secretDialog(`New secret of key ${k.name}`, `The key "${k.name}" has a new secret. Copy it now: it is not shown again.`, rotated.key, 'API key');
                  load();
                },
              }, 'Rotate'),
              h('button.small.danger', {
                type: 'button',
                'aria-label': `Delete key ${k.name}`,
                onclick: (e) => busy(e.currentTarget, async () => {
                  if (!(await confirmDialog('Delete API key', `Delete the key "${k.name}"? Apps using it stop working at once.${k.managed_by ? ` ${MANAGED_TEXT}` : ''}`))) return;
                  await api.del(`/keys/${k.id}`);
                  toast(`Key ${k.name} deleted.`);
                  load();
                }),
              }, 'Delete'),
            ],
          },
        );
        clear(body, table(cols, keys, { empty: 'No API keys yet. Create one to call the gateway.', caption: 'API keys' }));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };

    newBtn.addEventListener('click', async () => {
      if (ctx.role !== 'member' && !members.length) members = await api.list('/members').catch(() => []);
      const created = await createKey(ctx, members);
      if (!created) return;
      await secretDialog('Your new API key', `The key "${created.name}" was created. Copy it now:`, created.key, 'API key');
      load();
    });
    await load();
    const timer = setInterval(() => { if (idle(body)) load(); }, 10000);
    return () => clearInterval(timer);
  },
};
