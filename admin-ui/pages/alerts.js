// Budget alerts: the fields a guardrail's dialogs add (thresholds, webhook, signing secret), and
// the Alerts page: every alert the workspace's guardrails fired, newest first, with how its
// delivery went, and a button to send one again now.

import { api } from '../api.js';
import { h, clear, table, badge, alertBox, messageOf, fmtTime, fmtNum, busy, pageHeader, toast, field, metricLabel, windowLabel, idle } from '../ui.js';

/** The alert fields of a guardrail dialog, filled from policy `p` (none for a new one). */
export function alertFields(p) {
  const a = (p && p.alerts) || null;
  const at = h('input', {
    type: 'text', name: 'alerts.at', inputmode: 'numeric', autocomplete: 'off',
    placeholder: '80, 100', value: a ? a.at.join(', ') : '',
  });
  const webhook = h('input', {
    type: 'url', name: 'alerts.webhook', autocomplete: 'off',
    placeholder: 'https://hooks.example/aigw', value: a ? a.webhook : '',
  });
  const secret = h('input', { type: 'password', name: 'alerts.secret', autocomplete: 'new-password' });
  const unsign = a && a.has_secret
    ? h('label', h('input', { type: 'checkbox', name: 'alerts.unsign' }), ' Stop signing alerts')
    : null;
  return h('fieldset.field.alerts', { dataset: { name: 'alerts' } },
    h('legend', 'Budget alerts (optional)'),
    field('Alert at (% of the limit)', at, 'Each threshold sends one alert per window and subject, e.g. 80, 100. Leave empty for no alerts.'),
    field('Webhook URL', webhook, 'The gateway POSTs each alert to it as JSON, and retries for a day until it answers 2xx.'),
    field('Signing secret', secret, a && a.has_secret
      ? 'Alerts are signed (x-aigw-signature). Leave empty to keep the current secret.'
      : 'Optional, 16 characters or more: alerts then carry an x-aigw-signature HMAC.'),
    unsign);
}

/** Client-side checks of the alert fields: {field: message}. */
export function validateAlerts(fd) {
  const errors = {};
  const at = String(fd.get('alerts.at') || '').trim();
  const webhook = String(fd.get('alerts.webhook') || '').trim();
  if (!at && !webhook) return errors;
  const values = at.split(/[\s,%]+/).filter(Boolean);
  if (!values.length) errors['alerts.at'] = 'List one or more percents, e.g. 80, 100.';
  else if (values.some((v) => !/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 1000)) errors['alerts.at'] = 'Each threshold is a whole percent from 1 to 1000.';
  if (!/^https?:\/\/\S+$/.test(webhook)) errors['alerts.webhook'] = 'Enter an http:// or https:// URL.';
  return errors;
}

/**
 * The `alerts` value to send: null when both fields are empty (no alerts); the secret only
 * when one was typed (absent keeps the current one), null when signing is turned off.
 */
export function alertsValue(fd) {
  const at = String(fd.get('alerts.at') || '').trim();
  const webhook = String(fd.get('alerts.webhook') || '').trim();
  if (!at && !webhook) return null;
  const value = { at: at.split(/[\s,%]+/).filter(Boolean).map(Number), webhook };
  const secret = String(fd.get('alerts.secret') || '');
  if (secret) value.secret = secret;
  else if (fd.get('alerts.unsign')) value.secret = null;
  return value;
}

/** "80 %, 100 %" for the guardrails table. */
export function alertsText(p) {
  if (!p.alerts) return h('span.muted', '—');
  return h('span', { title: p.alerts.webhook }, p.alerts.at.map((t) => `${t} %`).join(', '));
}

const STATUS = {
  delivered: ['delivered', 'ok'],
  pending: ['retrying', 'warn'],
  failed: ['failed', 'danger'],
};

function statusCell(a) {
  const [text, kind] = STATUS[a.status] || [a.status, 'neutral'];
  // A pending alert never tried yet is just queued.
  const shown = a.status === 'pending' && a.attempts === 0 ? ['queued', 'info'] : [text, kind];
  return badge(shown[0], shown[1]);
}

function deliveryCell(a) {
  const lines = [h('span', `${a.attempts} ${a.attempts === 1 ? 'try' : 'tries'}`)];
  if (a.last_error) lines.push(h('br'), h('small.muted', a.last_error));
  if (a.status === 'pending' && a.next_attempt_at) lines.push(h('br'), h('small', 'next try ', h('time', { datetime: a.next_attempt_at }, fmtTime(a.next_attempt_at))));
  if (a.delivered_at) lines.push(h('br'), h('small', 'delivered ', h('time', { datetime: a.delivered_at }, fmtTime(a.delivered_at))));
  return lines;
}

export default {
  title: 'Alerts',
  roles: ['owner', 'admin'],
  async render(main) {
    const body = h('div', h('p.loading', 'Loading alerts…'));
    const more = h('div.more');
    clear(main,
      pageHeader('Alerts'),
      h('p.muted', 'Budget alerts the guardrails fired: each threshold once per window and subject, sent to the guardrail\'s webhook until it answers. Set thresholds in a guardrail\'s dialog.'),
      body, more);
    let rows = [];
    const load = async (cursor) => {
      try {
        const r = await api.get('/alerts', { cursor, limit: 50 });
        rows = cursor ? rows.concat(r.data || []) : (r.data || []);
        clear(body, table([
          { label: 'Fired', cell: (a) => h('time', { datetime: a.fired_at }, fmtTime(a.fired_at)) },
          { label: 'Subject', cell: (a) => (a.subject && (a.subject.name || `${a.subject.kind} #${a.subject.id}`)) || '—' },
          { label: 'Quota', cell: (a) => `${metricLabel(a.metric)} ${windowLabel(a.window)}` },
          { label: 'Threshold', cell: (a) => `${a.threshold} %` },
          { label: 'Used', cell: (a) => `${fmtNum(a.used)} / ${fmtNum(a.limit)}` },
          { label: 'Status', cell: statusCell },
          { label: 'Delivery', cell: deliveryCell },
          {
            label: 'Actions',
            class: 'actions-cell',
            cell: (a) => (a.status === 'delivered' ? null : h('button.small', {
              type: 'button',
              'aria-label': `Send the ${a.threshold} % alert now`,
              onclick: (e) => busy(e.currentTarget, async () => {
                try {
                  await api.post(`/alerts/${a.id}/retry`);
                  toast('Alert queued to be sent now.');
                } catch (err) {
                  toast(messageOf(err), 'error');
                }
                setTimeout(() => load(), 1500);
              }),
            }, 'Send now')),
          },
        ], rows, { empty: 'No alerts yet. Add thresholds and a webhook to a guardrail to be told before it refuses.', caption: 'Alerts' }));
        clear(more, r.next_cursor ? h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, () => load(r.next_cursor)) }, 'Load more') : null);
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    await load();
    const timer = setInterval(() => { if (idle(body) && rows.length <= 50) load(); }, 5000);
    return () => clearInterval(timer);
  },
};
