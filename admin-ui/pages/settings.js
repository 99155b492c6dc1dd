// Settings: my password; the workspace time zone (owner); departments, service tokens, and
// the tags and end users requests brought (owners and admins).

import { api, session } from '../api.js';
import { tokensCard } from './tokens.js';
import { labelsCard } from './labels.js';
import { h, clear, alertBox, managedBadge, managedWarning, MANAGED_TEXT, messageOf, fmtTime, field, handleSubmit, toast, busy, confirmDialog, dialog, pageHeader, setZone } from '../ui.js';

function passwordCard() {
  const form = h('form.form',
    field('Current password', h('input', { type: 'password', name: 'current_password', required: true, autocomplete: 'current-password' })),
    field('New password', h('input', { type: 'password', name: 'new_password', required: true, minLength: 8, autocomplete: 'new-password' }), 'At least 8 characters.'),
    field('Repeat the new password', h('input', { type: 'password', name: 'repeat', required: true, autocomplete: 'new-password' })),
    h('div.actions', h('button.primary', { type: 'submit' }, 'Change password')));
  handleSubmit(form, {
    validate: (fd) => (fd.get('new_password') !== fd.get('repeat') ? { repeat: 'The two new passwords differ.' } : null),
    send: async (fd) => {
      const r = await api.post('/auth/password', { current_password: fd.get('current_password'), new_password: fd.get('new_password') });
      if (r && r.token) session.set(r.token);
      form.reset();
      toast('Password changed.');
    },
  });
  return h('section.card', h('h2', 'My password'), form);
}

async function timezoneCard(ctx) {
  const card = h('section.card', h('h2', 'Workspace time zone'));
  let ws;
  try { ws = await api.get('/workspace'); } catch (err) { card.append(alertBox('error', messageOf(err))); return card; }
  const current = ws.effective_timezone || ws.timezone || ctx.timezone;
  card.append(h('p', 'Quota windows (days, months, N-minute windows) start at midnight in this zone, and the console shows times in it. Now: ', h('strong', current), '.'));
  if (ctx.role !== 'owner') return card;
  const zones = typeof Intl.supportedValuesOf === 'function' ? Intl.supportedValuesOf('timeZone') : [];
  const input = h('input', { name: 'timezone', required: true, value: ws.timezone || '', placeholder: current, list: 'tz-list', autocomplete: 'off' });
  const form = h('form.form', managedWarning(ws), field('Time zone (IANA name)', input, 'For example Asia/Shanghai, Europe/Berlin, America/New_York.'),
    h('datalist#tz-list', zones.map((z) => h('option', { value: z }))),
    h('div.actions', h('button.primary', { type: 'submit' }, 'Save time zone')));
  handleSubmit(form, {
    validate: (fd) => {
      try { new Intl.DateTimeFormat('en', { timeZone: fd.get('timezone').trim() }); return null; } catch { return { timezone: 'Not a time zone name this browser knows.' }; }
    },
    send: async (fd) => {
      const r = await api.patch('/workspace', { timezone: fd.get('timezone').trim() });
      const tz = (r && (r.effective_timezone || r.timezone)) || fd.get('timezone').trim();
      setZone(tz);
      ctx.timezone = tz;
      toast(`Time zone set to ${tz}.`);
    },
  });
  card.append(form);
  return card;
}

function departmentsCard(ctx) {
  const body = h('div', h('p.loading', 'Loading…'));
  const add = h('form.form.inline-form',
    field('New department', h('input', { name: 'name', required: true, maxLength: 64, autocomplete: 'off' })),
    h('button.primary', { type: 'submit' }, 'Add'));
  const load = async () => {
    try {
      const depts = await api.list('/departments');
      const rename = async (d) => {
        const done = await dialog(`Rename ${d.name}`, (close) => {
          const f = h('form.form', managedWarning(d), field('Name', h('input', { name: 'name', required: true, value: d.name })),
            h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Save')));
          handleSubmit(f, { send: async (fd) => { await api.patch(`/departments/${d.id}`, { name: fd.get('name').trim() }); close(true); } });
          return f;
        });
        if (done) { toast('Department renamed.'); load(); }
      };
      const remove = (e, d) => busy(e.currentTarget, async () => {
        if (!(await confirmDialog('Delete department', `Delete the department "${d.name}"?${d.managed_by ? ` ${MANAGED_TEXT}` : ''}`))) return;
        await api.del(`/departments/${d.id}`);
        toast('Department deleted.');
        load();
      });
      // A list, not a table: the card is a third of the page wide, and its buttons must fit.
      clear(body, depts.length
        ? h('ul.plain.dept-list', { 'aria-label': 'Departments' }, depts.map((d) => h('li.dept',
          h('span.dept-name', h('strong', d.name), managedBadge(d), h('small.muted', `created ${fmtTime(d.created_at, { seconds: false }).slice(0, 10)}`)),
          h('span.dept-actions',
            h('button.small', { type: 'button', 'aria-label': `Rename ${d.name}`, onclick: () => rename(d) }, 'Rename'),
            h('button.small.danger', { type: 'button', 'aria-label': `Delete ${d.name}`, onclick: (e) => remove(e, d) }, 'Delete')))))
        : h('p.empty', 'No departments yet.'));
    } catch (err) {
      clear(body, alertBox('error', messageOf(err)));
    }
  };
  handleSubmit(add, {
    send: async (fd) => {
      await api.post('/departments', { name: fd.get('name').trim() });
      add.reset();
      toast('Department added.');
      load();
    },
  });
  load();
  return h('section.card', h('h2', 'Departments'), body, add);
}

export default {
  title: 'Settings',
  async render(main, ctx) {
    const cards = [
      h('section.card', h('h2', 'Me'), h('dl.kv',
        h('dt', 'Email'), h('dd', ctx.me.email),
        h('dt', 'Role'), h('dd', ctx.role),
        h('dt', 'Workspace'), h('dd', ctx.workspace.name || '—'))),
      passwordCard(),
      await timezoneCard(ctx),
    ];
    if (ctx.role !== 'member') cards.push(departmentsCard(ctx), tokensCard(ctx), labelsCard());
    clear(main, pageHeader('Settings'), h('div.grid', cards));
  },
};
