// Service tokens (owners and admins, in Settings): bearers for scripts, CI and Terraform. A token
// has a role no higher than its creator's, its secret is shown once, and revoking it stops it on
// every gateway at its next request. Only a role that covers a token's may revoke it.

import { api } from '../api.js';
import {
  h, clear, table, badge, alertBox, messageOf, fmtTime, fmtRecent, dialog, confirmDialog, field, select, handleSubmit, toast, busy,
  secretDialog, breakable,
} from '../ui.js';

const RANK = { member: 0, admin: 1, owner: 2 };

/** A date-time typed in the form (local time) as RFC 3339, or null when blank. */
function expiryOf(fd) {
  const v = String(fd.get('expires_at') || '').trim();
  return v ? new Date(v).toISOString() : null;
}

function statusCell(t) {
  if (t.status === 'revoked') return [badge('revoked', 'neutral'), t.revoked_by_email ? h('small.muted.block', `by ${t.revoked_by_email}`) : null];
  if (t.status === 'expired') return badge('expired', 'danger');
  return badge('active', 'ok');
}

function createToken(ctx) {
  return dialog('New service token', (close) => {
    const roles = ['member', 'admin', 'owner'].filter((r) => RANK[r] <= RANK[ctx.role]);
    const form = h('form.form',
      field('Name', h('input', { name: 'name', required: true, maxLength: 100, autocomplete: 'off', placeholder: 'e.g. terraform, ci-deploy' }), 'What the token is for: the audit log names it with each change it makes.'),
      field('Role', select('role', roles.map((r) => [r, r]), 'member'), `At most your own role. It acts for you, with the lower of this role and yours, while you are an active member.`),
      field('Expires at', h('input', { name: 'expires_at', type: 'datetime-local' }), 'Optional, in your browser\'s local time; blank for never.'),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Create token')));
    handleSubmit(form, {
      validate: (fd) => {
        if (!fd.get('name').trim()) return { name: 'Give the token a name.' };
        const exp = expiryOf(fd);
        if (exp && new Date(exp).getTime() <= Date.now()) return { expires_at: 'Choose a time in the future, or leave it blank.' };
        return null;
      },
      send: async (fd) => {
        const body = { name: fd.get('name').trim(), role: fd.get('role') };
        if (expiryOf(fd)) body.expires_at = expiryOf(fd);
        close(await api.post('/tokens', body));
      },
    });
    return form;
  });
}

/** The Service tokens card of Settings. */
export function tokensCard(ctx) {
  const body = h('div', h('p.loading', 'Loading…'));
  const newButton = h('button.primary', { type: 'button' }, 'New service token');
  const load = async () => {
    try {
      const tokens = await api.list('/tokens');
      const revoke = (e, t) => busy(e.currentTarget, async () => {
        if (!(await confirmDialog('Revoke service token', `Revoke "${t.name}" (${t.prefix}…)? Every gateway refuses it from its next request. This cannot be undone.`, { confirm: 'Revoke' }))) return;
        await api.del(`/tokens/${t.id}`);
        toast('Token revoked.');
        load();
      });
      clear(body, table([
        { label: 'Name', cell: (t) => [h('strong', breakable(t.name)), h('span.key-prefix', `${t.prefix}…`)] },
        { label: 'Role', cell: (t) => t.role },
        { label: 'Created by', cell: (t) => breakable(t.created_by_email || `member #${t.created_by}`) },
        { label: 'Created', class: 'nowrap', cell: (t) => h('span', { title: fmtTime(t.created_at) }, fmtRecent(t.created_at, { seconds: false })) },
        { label: 'Last used', class: 'nowrap', cell: (t) => (t.last_used_at ? h('span', { title: fmtTime(t.last_used_at) }, fmtRecent(t.last_used_at, { seconds: false })) : h('span.muted', 'never')) },
        { label: 'Expires', class: 'nowrap', cell: (t) => (t.expires_at ? h('span', { title: fmtTime(t.expires_at) }, fmtRecent(t.expires_at, { seconds: false })) : h('span.muted', 'never')) },
        { label: 'Status', cell: statusCell },
        {
          label: 'Actions',
          class: 'actions-cell',
          cell: (t) => (t.status === 'revoked' || RANK[t.role] > RANK[ctx.role]
            ? null
            : h('button.small.danger', { type: 'button', 'aria-label': `Revoke token ${t.name}`, onclick: (e) => revoke(e, t) }, 'Revoke')),
        },
      ], tokens, { empty: 'No service tokens yet.', caption: 'Service tokens' }));
    } catch (err) {
      clear(body, alertBox('error', messageOf(err)));
    }
  };
  newButton.addEventListener('click', async () => {
    const created = await createToken(ctx);
    if (!created) return;
    await secretDialog('Your new service token', `Send it as "Authorization: Bearer …" to this gateway's /admin/v1 API. It acts as ${created.role} for you.`, created.token, 'Service token');
    load();
  });
  load();
  return h('section.card.wide-card',
    h('div.card-head', h('h2', 'Service tokens'), newButton),
    h('p.muted', 'For scripts, CI and Terraform: each token has a role no higher than its creator\'s, is shown once, and can be revoked at any time.'),
    body);
}
