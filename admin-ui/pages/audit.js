// Audit log (owners and admins): who changed what, with the values before and after.

import { api } from '../api.js';
import { h, clear, table, alertBox, messageOf, fmtTime, busy, pageHeader } from '../ui.js';

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
          { label: 'When', cell: (a) => fmtTime(a.at) },
          { label: 'Who', cell: (a) => a.actor_email || (a.actor_id ? `member #${a.actor_id}` : 'system') },
          { label: 'Action', cell: (a) => h('code', a.action) },
          { label: 'Target', cell: (a) => `${a.target_kind || ''}${a.target_id !== null && a.target_id !== undefined ? ` #${a.target_id}` : ''}` },
          { label: 'Before', cell: (a) => jsonBlock(a.before) },
          { label: 'After', cell: (a) => jsonBlock(a.after) },
        ], rows, { empty: 'Nothing changed yet.', caption: 'Audit log' }));
        clear(more, r.next_cursor ? h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, () => load(r.next_cursor)) }, 'Load more') : null);
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    await load();
  },
};
