// Audit log (owners and admins): who changed what (with which service token), the target by its
// name, with the values before and after.

import { api } from '../api.js';
import { h, clear, table, alertBox, messageOf, dateTime, busy, pageHeader, breakable } from '../ui.js';

const KINDS = {
  api_key: 'API key', member: 'Member', department: 'Department', upstream: 'Upstream', model: 'Model', policy: 'Guardrail',
  workspace: 'Workspace', service_token: 'Service token',
};

/** The target by its name ("API key ada@acme.test/ci"), its id beside it. */
function targetCell(a) {
  const kind = KINDS[a.target_kind] || a.target_kind || '';
  const id = a.target_id !== null && a.target_id !== undefined ? `#${a.target_id}` : '';
  if (!a.target_name) return `${kind} ${id}`.trim();
  return [`${kind} `, h('strong', breakable(a.target_name)), id ? h('small.muted', ` ${id}`) : null];
}

function jsonBlock(v) {
  if (v === null || v === undefined || v === '') return h('span.muted', '—');
  let text = v;
  try { text = JSON.stringify(typeof v === 'string' ? JSON.parse(v) : v, null, 2); } catch { text = String(v); }
  return h('details', h('summary', 'show'), h('pre', text));
}

export default {
  title: 'Audit log',
  roles: ['owner', 'admin'],
  async render(main) {
    const body = h('div', h('p.loading', 'Loading the audit log…'));
    const more = h('div.more');
    clear(main, pageHeader('Audit log'), h('p.muted', 'Every change made through the console or the admin API.'), body, more);
    let rows = [];
    const load = async (cursor) => {
      try {
        const r = await api.get('/audit', { cursor, limit: 50 });
        rows = cursor ? rows.concat(r.data || []) : (r.data || []);
        clear(body, table([
          { label: 'When', cell: (a) => dateTime(a.at) },
          {
            label: 'Who',
            class: 'c-who',
            cell: (a) => [
              breakable(a.actor_email || (a.actor_id ? `member #${a.actor_id}` : 'system')),
              a.actor_token ? h('small.muted.block', { title: 'Made with this service token' }, 'token ', breakable(a.actor_token)) : null],
          },
          { label: 'Action', cell: (a) => h('code', a.action) },
          { label: 'Target', cell: targetCell },
          { label: 'Before', class: 'nowrap', cell: (a) => jsonBlock(a.before) },
          { label: 'After', class: 'nowrap', cell: (a) => jsonBlock(a.after) },
        ], rows, { empty: 'Nothing changed yet.', caption: 'Audit log' }));
        clear(more, r.next_cursor ? h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, () => load(r.next_cursor)) }, 'Load more') : null);
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    await load();
  },
};
