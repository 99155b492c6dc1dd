// Guardrails: quota policies (subject × metric × window × limit, enforce or shadow) with the
// current usage of each. Owners manage every policy; admins see them all and manage the ones
// the API lets them (key budgets, member policies on role-member members).

import { api } from '../api.js';
import {
  h, clear, table, bar, badge, managedBadge, managedWarning, MANAGED_TEXT, alertBox, messageOf, fmtNum, fmtTime, dateTime, countdown, dialog, confirmDialog,
  field, select, handleSubmit, toast, busy, pageHeader, METRICS, metricLabel, metricUnit, windowLabel, idle,
} from '../ui.js';
import { alertFields, alertsValue, alertsText, validateAlerts } from './alerts.js';

export const SUBJECTS = [
  ['member', 'Member'],
  ['dept', 'Department'],
  ['ws', 'Workspace'],
  ['apikey', 'API key'],
  ['tag', 'Tag'],
  ['end_user', 'End user'],
];
const SUBJECT_NAMES = Object.fromEntries(SUBJECTS);
const EACH_NAMES = {
  member: 'Each member', dept: 'Each department', ws: 'The workspace', apikey: 'Each API key', tag: 'Each tag value', end_user: 'Each end user',
};
/** Subjects named by text (a tag value, an end user's id) rather than chosen from a list. */
const TEXT_TARGETS = {
  tag: ['Tag', 'team=search for one value, or team=* for each value of the tag on its own counter.', 'team=search'],
  end_user: ['End user', 'The id clients send in x-aigw-end-user (or the body\'s user).', 'e.g. alice@example.com'],
};

export const WINDOWS = [
  ['minute', 'Minute'],
  ['minutes', 'N minutes'],
  ['day', 'Day'],
  ['week', 'Week (from Monday)'],
  ['month', 'Month'],
  ['total', 'Total (never resets)'],
];

/** The window string from the form: "minute", "<N>minutes", "day", "week", "month", "total". */
function windowValue(fd) {
  const w = fd.get('window');
  return w === 'minutes' ? `${Number(fd.get('window_n'))}minutes` : w;
}

/** Validation shared by the create forms. */
export function validatePolicy(fd) {
  const errors = {};
  if (fd.get('window') === 'minutes') {
    const n = Number(fd.get('window_n'));
    if (!Number.isInteger(n) || n < 1 || 1440 % n !== 0) {
      errors.window_n = 'N must be a whole number of minutes that divides a day (1440), e.g. 5, 15, 60.';
    }
  }
  const limit = Number(fd.get('limit'));
  if (!(limit > 0)) errors.limit = 'The limit must be a number above 0.';
  else if (fd.get('metric') !== 'credits' && !Number.isInteger(limit)) errors.limit = 'Requests and tokens are counted in whole numbers.';
  return errors;
}

/** Metric, window (with N), limit and mode controls. */
export function metricWindowFields(defaults = {}) {
  const metric = select('metric', METRICS, defaults.metric || 'requests');
  const windowSel = select('window', WINDOWS, defaults.window || 'day');
  const n = h('input', { type: 'number', name: 'window_n', min: 1, max: 1440, step: 1, value: 5, inputmode: 'numeric' });
  const nField = field('Minutes per window (N)', n, 'Windows start at midnight in the workspace time zone; N must divide 1440.');
  const syncN = () => { nField.hidden = windowSel.value !== 'minutes'; n.disabled = nField.hidden; };
  windowSel.addEventListener('change', syncN);
  syncN();
  const limit = h('input', { type: 'number', name: 'limit', required: true, min: 0, step: 'any', inputmode: 'decimal' });
  return [
    field('Metric', metric),
    field('Window', windowSel),
    nField,
    field('Limit', limit, 'Requests at or above the limit are refused until the window resets.'),
    modeFieldset('enforce'),
  ];
}

export function modeFieldset(value) {
  return h('fieldset.field.radios', { dataset: { name: 'mode' } },
    h('legend', 'Mode'),
    h('label', h('input', { type: 'radio', name: 'mode', value: 'enforce', checked: value === 'enforce' }), ' Enforce (refuse over the limit)'),
    h('label', h('input', { type: 'radio', name: 'mode', value: 'shadow', checked: value === 'shadow' }), ' Shadow (report only)'));
}

function targetText(p) {
  if (p.subject === 'tag' && p.target && p.target.endsWith('=*')) return `Each value of ${p.target.slice(0, -2)}`;
  if (p.target_id === null || p.target_id === undefined) {
    return `${EACH_NAMES[p.subject] || 'Each'}${p.department_name || p.department_id ? ` in ${p.department_name || `department ${p.department_id}`}` : ''}`;
  }
  return p.target || String(p.target_id);
}

function usageCell(p) {
  if (p.used === null || p.used === undefined) return h('span.muted', 'counted per subject');
  const label = `${targetText(p)} ${metricLabel(p.metric)}`;
  return h('div.usage-cell', bar(Number(p.used), Number(p.limit), label), h('small', `${fmtNum(p.used)} / ${fmtNum(p.limit)}`));
}

/** When the window ends (not the spread `reset_at` clients are told, a minute or two later). */
function resetCell(p) {
  if (p.target_id === null || p.target_id === undefined) return '—';
  const end = p.window_end || p.reset_at;
  if (!end) return p.window === 'total' ? 'never' : '—';
  return h('span.window-end', dateTime(end, { seconds: false }), h('br'), h('small.nowrap', countdown(end, 'now')));
}

/** The dialog to edit a policy's limit and mode. */
export async function editPolicy(p) {
  return dialog(`Edit guardrail`, (close) => {
    const limit = h('input', { type: 'number', name: 'limit', required: true, min: 0, step: 'any', value: p.limit });
    const form = h('form.form',
      managedWarning(p),
      h('p', `${SUBJECT_NAMES[p.subject] || p.subject}: ${targetText(p)} — ${metricLabel(p.metric).toLowerCase()} ${windowLabel(p.window)}`),
      field('Limit', limit),
      modeFieldset(p.mode),
      alertFields(p),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Save')));
    handleSubmit(form, {
      validate: (fd) => ({
        ...(Number(fd.get('limit')) > 0 ? {} : { limit: 'The limit must be a number above 0.' }),
        ...validateAlerts(fd),
      }),
      send: async (fd) => {
        const body = { limit: Number(fd.get('limit')), mode: fd.get('mode') };
        const alerts = alertsValue(fd);
        // Unchanged alerts are not sent: a guardrail edited by someone who may not set them keeps them.
        if (JSON.stringify(alerts) !== JSON.stringify(p.alerts ? { at: p.alerts.at, webhook: p.alerts.webhook } : null)) body.alerts = alerts;
        await api.patch(`/policies/${p.id}`, body);
        toast('Guardrail saved.');
        close(true);
      },
    });
    return form;
  });
}

/**
 * What the toast says of a policy just created (`done`: "Guardrail created"): the usage recorded
 * before it in its current window (for `total`, the recorded history) that it counts (the API's
 * `counted_before`).
 */
export function createdText(done, p) {
  const c = p && p.counted_before;
  if (!c || !c.subjects) return `${done}.`;
  const since = c.since ? `since ${fmtTime(c.since)}` : 'in the recorded history';
  const whose = c.subjects === 1 ? '' : ` by ${fmtNum(c.subjects)} subjects`;
  return `${done}. It counts the ${fmtNum(c.used)} ${metricUnit(p.metric)} already used${whose} ${since}.`;
}

export async function deletePolicy(p) {
  const ok = await confirmDialog('Delete guardrail', `Delete the ${metricLabel(p.metric).toLowerCase()} ${windowLabel(p.window)} limit on ${targetText(p)}? Usage counters are kept.${p.managed_by ? ` ${MANAGED_TEXT}` : ''}`);
  if (!ok) return false;
  await api.del(`/policies/${p.id}`);
  toast('Guardrail deleted.');
  return true;
}

async function createPolicy(ctx, lists) {
  return dialog('New guardrail', (close) => {
    const subjects = ctx.role === 'owner' ? SUBJECTS : SUBJECTS.filter(([s]) => s === 'member' || s === 'apikey');
    const subject = select('subject', subjects, 'member');
    const scopeOne = h('input', { type: 'radio', name: 'scope', value: 'one', checked: true });
    const scopeEach = h('input', { type: 'radio', name: 'scope', value: 'each' });
    const scope = h('fieldset.field.radios', { dataset: { name: 'scope' } }, h('legend', 'Applies to'),
      h('label', scopeOne, ' One subject'), h('label.each-label', scopeEach, h('span.each-text', ' Each member')));
    const target = h('select', { name: 'target_id' });
    const targetField = field('Subject', target);
    const targetInput = h('input', { name: 'target', autocomplete: 'off' });
    const textField = field('Target', targetInput, TEXT_TARGETS.tag[1]);
    const dept = select('department_id', [['', 'The whole workspace'], ...lists.departments.map((d) => [d.id, d.name])], '');
    const deptField = field('Within', dept, 'Narrow "each" to the members or keys of one department.');

    const sync = () => {
      const s = subject.value;
      const opts = {
        member: lists.members.map((m) => [m.id, `${m.email}${m.role !== 'member' ? ` (${m.role})` : ''}`]),
        dept: lists.departments.map((d) => [d.id, d.name]),
        ws: [[ctx.workspace.id, ctx.workspace.name || 'This workspace']],
        apikey: lists.keys.map((k) => [k.id, `${k.member_email || ''}/${k.name}`]),
      }[s] || [];
      const prev = target.value;
      target.replaceChildren(h('option', { value: '' }, opts.length ? `Choose a ${SUBJECT_NAMES[s].toLowerCase()}…` : `No ${SUBJECT_NAMES[s].toLowerCase()} to choose`),
        ...opts.map(([v, t]) => h('option', { value: v, selected: String(v) === prev || (s === 'ws') }, t)));
      scope.querySelector('.each-text').textContent = ` ${EACH_NAMES[s]}`;
      scope.querySelector('.each-label').hidden = s === 'ws';
      if (s === 'ws') scopeOne.checked = true;
      const each = scopeEach.checked;
      const byText = TEXT_TARGETS[s];
      targetField.hidden = each || Boolean(byText);
      target.disabled = targetField.hidden;
      target.required = !targetField.hidden;
      textField.hidden = each || !byText;
      targetInput.disabled = textField.hidden;
      targetInput.required = !textField.hidden;
      if (byText) {
        textField.querySelector('label').textContent = byText[0];
        targetInput.placeholder = byText[2];
        const hint = textField.querySelector('.hint');
        if (hint) hint.textContent = byText[1];
      }
      deptField.hidden = !(each && (s === 'member' || s === 'apikey') && lists.departments.length);
      dept.disabled = deptField.hidden;
    };
    subject.addEventListener('change', sync);
    scope.addEventListener('change', sync);

    const form = h('form.form',
      field('Subject kind', subject),
      scope, targetField, textField, deptField,
      ...metricWindowFields(),
      alertFields(null),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Create guardrail')));
    sync();
    handleSubmit(form, {
      validate: (fd) => {
        const errors = { ...validatePolicy(fd), ...validateAlerts(fd) };
        const byText = TEXT_TARGETS[fd.get('subject')];
        if (fd.get('scope') === 'one' && !byText && !fd.get('target_id')) errors.target_id = 'Choose who this guardrail applies to.';
        const t = String(fd.get('target') || '').trim();
        if (fd.get('scope') === 'one' && byText && !t) errors.target = `Name the ${byText[0].toLowerCase()}.`;
        else if (fd.get('scope') === 'one' && fd.get('subject') === 'tag' && !/^[a-z0-9_.-]{1,64}=[^,]{1,128}$/.test(t)) {
          errors.target = 'Write key=value or key=* (key: a-z, 0-9, _ . -).';
        }
        return errors;
      },
      send: async (fd) => {
        const each = fd.get('scope') === 'each';
        const byText = TEXT_TARGETS[fd.get('subject')];
        const body = {
          subject: fd.get('subject'),
          ...(byText ? { target: each ? '*' : String(fd.get('target')).trim() } : { target_id: each ? null : Number(fd.get('target_id')) }),
          metric: fd.get('metric'),
          window: windowValue(fd),
          limit: Number(fd.get('limit')),
          mode: fd.get('mode'),
        };
        if (each && fd.get('department_id')) body.department_id = Number(fd.get('department_id'));
        const alerts = alertsValue(fd);
        if (alerts) body.alerts = alerts;
        const created = await api.post('/policies', body);
        toast(createdText('Guardrail created', created));
        close(true);
      },
    });
    return form;
  }, { wide: true });
}

export { windowValue };

export default {
  title: 'Guardrails',
  roles: ['owner', 'admin'],
  async render(main, ctx) {
    const body = h('div', h('p.loading', 'Loading guardrails…'));
    const newBtn = h('button.primary', { type: 'button' }, 'New guardrail');
    clear(main,
      pageHeader('Guardrails', newBtn),
      h('p.muted', 'Quotas on members, departments, the workspace, API keys, tag values (x-aigw-tags) and end users. A request is refused once usage reaches the limit; shadow guardrails only report.'),
      body);

    const lists = { members: [], departments: [], keys: [] };
    const loadLists = async () => {
      const [members, departments, keys] = await Promise.allSettled([api.list('/members'), api.list('/departments'), api.list('/keys')]);
      lists.members = members.status === 'fulfilled' ? members.value : [];
      lists.departments = departments.status === 'fulfilled' ? departments.value : [];
      lists.keys = keys.status === 'fulfilled' ? keys.value : [];
    };

    const load = async () => {
      try {
        const policies = await api.list('/policies');
        const deptName = Object.fromEntries(lists.departments.map((d) => [d.id, d.name]));
        policies.forEach((p) => { if (p.department_id) p.department_name = deptName[p.department_id]; });
        clear(body, table([
          { label: 'Subject', cell: (p) => SUBJECT_NAMES[p.subject] || p.subject },
          { label: 'Applies to', cell: (p) => [targetText(p), ' ', managedBadge(p)] },
          { label: 'Limit', cell: (p) => `${fmtNum(p.limit)} ${metricLabel(p.metric).toLowerCase()} ${windowLabel(p.window)}` },
          { label: 'Usage', cell: usageCell },
          { label: 'Remaining', cell: (p) => (p.remaining === null || p.remaining === undefined ? '—' : fmtNum(p.remaining)) },
          { label: 'Window ends', cell: resetCell },
          { label: 'Mode', cell: (p) => (p.mode === 'shadow' ? badge('shadow', 'info') : badge('enforce', 'ok')) },
          { label: 'Alerts', cell: alertsText },
          {
            label: 'Actions',
            class: 'actions-cell',
            cell: (p) => [
              h('button.small', { type: 'button', 'aria-label': `Edit guardrail on ${targetText(p)}`, onclick: async () => { if (await editPolicy(p)) load(); } }, 'Edit'),
              h('button.small.danger', {
                type: 'button',
                'aria-label': `Delete guardrail on ${targetText(p)}`,
                onclick: (e) => busy(e.currentTarget, async () => { if (await deletePolicy(p)) load(); }),
              }, 'Delete'),
            ],
          },
        ], policies, { empty: 'No guardrails yet. Create one to cap requests, tokens or credits.', caption: 'Guardrails' }));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };

    newBtn.addEventListener('click', async () => {
      await loadLists();
      if (await createPolicy(ctx, lists)) load();
    });
    await loadLists();
    await load();
    const timer = setInterval(() => { if (idle(body)) load(); }, 10000);
    return () => clearInterval(timer);
  },
};
