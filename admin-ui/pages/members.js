// Members (owners and admins): invite (shows a one-time password), change role and department,
// the models their keys may call and their cap on requests in flight, deactivate or reactivate,
// reset a password.

import { api } from '../api.js';
import {
  h, clear, table, badge, managedBadge, confirmManaged, MANAGED_TEXT, alertBox, messageOf, fmtTime, dateTime, dialog, confirmDialog, field, select, handleSubmit, toast, busy, pageHeader, secretDialog,
} from '../ui.js';
import { limitsFields, validateLimits, limitsBody, limitsCell, editLimits } from './limits.js';

const ROLES = [['member', 'Member'], ['admin', 'Admin'], ['owner', 'Owner']];

async function invite(ctx, departments) {
  return dialog('Invite a member', (close) => {
    const roles = ctx.role === 'owner' ? ROLES : ROLES.filter(([r]) => r !== 'owner');
    const form = h('form.form',
      field('Email', h('input', { type: 'email', name: 'email', required: true, autocomplete: 'off' })),
      field('Role', select('role', roles, 'member'), 'Members manage their own keys; admins manage members, upstreams and models; owners everything.'),
      field('Department', select('department_id', [['', 'None'], ...departments.map((d) => [d.id, d.name])], '')),
      ...limitsFields({}, { who: 'member' }),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Invite')));
    handleSubmit(form, {
      validate: validateLimits,
      send: async (fd) => {
        const body = { email: fd.get('email').trim(), role: fd.get('role') };
        if (fd.get('department_id')) body.department_id = Number(fd.get('department_id'));
        const limits = limitsBody(fd);
        if (limits.allowed_models) body.allowed_models = limits.allowed_models;
        if (limits.max_in_flight) body.max_in_flight = limits.max_in_flight;
        close(await api.post('/members', body));
      },
    });
    return form;
  });
}

export default {
  title: 'Members',
  roles: ['owner', 'admin'],
  async render(main, ctx) {
    const newBtn = h('button.primary', { type: 'button' }, 'Invite member');
    const body = h('div', h('p.loading', 'Loading members…'));
    clear(main, pageHeader('Members', newBtn), h('p.muted', 'People who can sign in to this console and own API keys.'), body);
    let departments = [];
    const load = async () => {
      try {
        const [members, depts] = await Promise.all([api.list('/members'), api.list('/departments').catch(() => [])]);
        departments = depts;
        const patch = async (m, change, what) => {
          if (!(await confirmManaged(m, m.email))) { load(); return; }
          try {
            await api.patch(`/members/${m.id}`, change);
            toast(`${m.email}: ${what}.`);
          } catch (err) {
            toast(messageOf(err), 'error');
          }
          load();
        };
        clear(body, table([
          { label: 'Email', cell: (m) => [h('strong', m.email), m.id === ctx.me.id ? h('small.muted', ' (you)') : null, ' ', managedBadge(m)] },
          {
            label: 'Role',
            class: 'c-role',
            cell: (m) => {
              const sel = select('role', ctx.role === 'owner' || m.role === 'owner' ? ROLES : ROLES.filter(([r]) => r !== 'owner'), m.role, {
                'aria-label': `Role of ${m.email}`, disabled: m.id === ctx.me.id,
              });
              sel.addEventListener('change', () => patch(m, { role: sel.value }, `role changed to ${sel.value}`));
              return sel;
            },
          },
          {
            label: 'Department',
            class: 'c-dept',
            cell: (m) => {
              const sel = select('department_id', [['', 'None'], ...departments.map((d) => [d.id, d.name])], m.department_id ?? '', { 'aria-label': `Department of ${m.email}` });
              sel.addEventListener('change', () => patch(m, { department_id: sel.value ? Number(sel.value) : null }, 'department changed'));
              return sel;
            },
          },
          { label: 'Limits', class: 'c-limits', cell: limitsCell },
          { label: 'Status', cell: (m) => (m.active === false ? badge('deactivated', 'neutral') : badge('active', 'ok')) },
          { label: 'Since', cell: (m) => dateTime(m.created_at, { seconds: false }) },
          {
            label: 'Actions',
            class: 'actions-cell',
            cell: (m) => [
              // Only the owner sets the limits of owners and admins.
              ctx.role === 'owner' || m.role === 'member' ? h('button.small', {
                type: 'button',
                'aria-label': `Limits of ${m.email}`,
                onclick: async () => { if (await editLimits(m, { title: `Limits of ${m.email}`, path: `/members/${m.id}`, who: 'member', what: m.email })) load(); },
              }, 'Limits') : null,
              ...(m.id === ctx.me.id ? [] : [
                h('button.small', {
                  type: 'button',
                  'aria-label': `${m.active === false ? 'Reactivate' : 'Deactivate'} ${m.email}`,
                  onclick: async () => {
                    if (m.active !== false && !(await confirmDialog('Deactivate member', `Deactivate ${m.email}? They cannot sign in and their keys stop working.`, { confirm: 'Deactivate' }))) return;
                    patch(m, { active: m.active === false }, m.active === false ? 'reactivated' : 'deactivated');
                  },
                }, m.active === false ? 'Reactivate' : 'Deactivate'),
                h('button.small', {
                  type: 'button',
                  'aria-label': `Reset the password of ${m.email}`,
                  onclick: (e) => busy(e.currentTarget, async () => {
                    if (!(await confirmDialog('Reset password', `Give ${m.email} a new one-time password? Their current password stops working.${m.managed_by ? ` ${MANAGED_TEXT}` : ''}`, { confirm: 'Reset password', danger: false }))) return;
                    const r = await api.post(`/members/${m.id}/reset-password`);
                    await secretDialog('New one-time password', `Give this password to ${m.email}; they should change it after signing in.`, r.one_time_password, 'One-time password');
                  }),
                }, 'Reset password'),
              ]),
            ],
          },
        ], members, { empty: 'No members yet.', caption: 'Members' }));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    let loaded;
    newBtn.addEventListener('click', async () => {
      await loaded; // the button is there before the departments are: offer them all
      const m = await invite(ctx, departments);
      if (!m) return;
      await secretDialog('Member invited', `${m.email} can sign in with this one-time password:`, m.one_time_password, 'One-time password');
      load();
    });
    loaded = load();
    await loaded;
  },
};
