// Tags and end users (owners and admins, in Settings): the labels the workspace's requests
// brought, least recently seen first, with the key that brought each. Pruning one (or every one
// unseen for some days) frees its place under the workspace's caps and its key's; a label a
// guardrail names is never pruned.

import { api, request } from '../api.js';
import {
  h, clear, table, alertBox, messageOf, fmtTime, fmtRecent, fmtNum, confirmDialog, field, select, toast, busy, breakable,
} from '../ui.js';

const KINDS = [['end_user', 'End users'], ['tag', 'Tag values']];

function when(ms) {
  return h('span', { title: fmtTime(ms) }, fmtRecent(ms, { seconds: false }));
}

/** The Tags and end users card of Settings. */
export function labelsCard() {
  const kind = select('kind', KINDS, 'end_user');
  const days = h('input', { name: 'unseen_days', type: 'number', min: 1, max: 36500, value: 30 });
  const summary = h('p.muted');
  const body = h('div', h('p.loading', 'Loading…'));
  const prune = async (query, what) => {
    if (!(await confirmDialog('Prune labels', `Delete ${what}? Each one frees its place under the caps; if a request brings it again it is new, with fresh counters.`, { confirm: 'Prune' }))) return;
    const r = await request('/labels', { method: 'DELETE', query: { kind: kind.value, ...query } });
    toast(`${fmtNum(r.deleted)} pruned.`);
    load();
  };
  const load = async () => {
    try {
      const page = await api.get('/labels', { kind: kind.value });
      const caps = page.caps || {};
      clear(summary, kind.value === 'end_user'
        ? `${fmtNum(page.total)} end users; at most ${fmtNum(caps.max_end_users)} in the workspace and ${fmtNum(caps.max_end_users_per_key)} brought by one key.`
        : `${fmtNum(page.total)} tag values; at most ${fmtNum(caps.max_tag_keys)} tag keys and ${fmtNum(caps.max_tag_values)} values of each in the workspace, ${fmtNum(caps.max_tag_keys_per_key)} and ${fmtNum(caps.max_tag_values_per_key)} brought by one key.`,
        caps.label_expiry_days ? ` Unseen for ${caps.label_expiry_days} days, they expire.` : ' They never expire.');
      clear(body, table([
        { label: 'Name', cell: (l) => h('strong', breakable(l.name)) },
        { label: 'Brought by', cell: (l) => (l.api_key_id ? breakable(l.api_key_name || `key #${l.api_key_id}`) : h('span.muted', 'a guardrail or an older gateway')) },
        { label: 'Last seen', class: 'nowrap', cell: (l) => when(l.last_seen_at) },
        { label: 'Created', class: 'nowrap', cell: (l) => when(l.created_at) },
        {
          label: 'Actions',
          class: 'actions-cell',
          cell: (l) => h('button.small.danger', {
            type: 'button',
            'aria-label': `Prune ${l.name}`,
            onclick: (e) => busy(e.currentTarget, () => prune({ id: l.id }, `"${l.name}"`)),
          }, 'Prune'),
        },
      ], page.data, { empty: 'None yet.', caption: 'Labels' }));
    } catch (err) {
      clear(body, alertBox('error', messageOf(err)));
    }
  };
  kind.addEventListener('change', load);
  const pruneUnseen = h('button.small.danger', {
    type: 'button',
    onclick: (e) => busy(e.currentTarget, async () => {
      const d = Number(days.value);
      if (!Number.isInteger(d) || d < 1) { toast('Give a number of days, 1 or more.', 'error'); return; }
      await prune({ unseen_days: d }, `every ${kind.value === 'end_user' ? 'end user' : 'tag value'} unseen for ${d} days`);
    }),
  }, 'Prune unseen');
  load();
  return h('section.card.wide-card',
    h('div.card-head', h('h2', 'Tags and end users')),
    h('p.muted', 'What requests brought in x-aigw-tags and x-aigw-end-user, least recently seen first. A guardrail\'s own value is never pruned.'),
    h('div.label-filters', field('Show', kind), field('Unseen for (days)', days), pruneUnseen),
    summary,
    body);
}
