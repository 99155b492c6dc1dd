// Upstreams: the credential pool. Each credential shows provider, models, limits, quota group,
// why it is parked and a countdown to `resumes_at` (the end of its latest running lock), with a
// "Test connection" that clears its locks on success, the provider's own words (masked) that
// parked it, and its last 24 hours: attempts, failures, served, latency, time parked. The secret
// is write-only.

import { api } from '../api.js';
import {
  h, clear, badge, managedBadge, managedWarning, MANAGED_TEXT, alertBox, messageOf, fmtNum, fmtTime, fmtDuration, countdown, dialog, confirmDialog,
  field, select, handleSubmit, toast, busy, pageHeader, idle,
} from '../ui.js';

const PROVIDERS = [
  ['openai', 'OpenAI'],
  ['anthropic', 'Anthropic'],
  ['openrouter', 'OpenRouter'],
  ['gemini', 'Gemini'],
  ['openai-compatible', 'OpenAI-compatible (any base URL)'],
  ['azure', 'Azure OpenAI (resource endpoint; model upstream name = deployment)'],
  ['bedrock', 'AWS Bedrock (region and access keys; model upstream name = model id)'],
  ['google', 'Google Gemini API (generateContent; x-goog-api-key)'],
];

/** Plain words for the classification rules the gateway names (kRouter's order). */
const RULES = {
  monthly_copilot: 'monthly allowance used up (whole credential)',
  monthly_anthropic_spend_cap: 'Anthropic monthly spend cap reached',
  openrouter_free_daily: 'OpenRouter free daily cap reached',
  provider_named_reset: 'rate-limited; the provider named when it resets',
  aws_throttling: 'AWS throttled this model, resting 1 min',
  aws_service_quota: 'an AWS service quota of the account is used up, resting 5 min',
  aws_keys_rejected: 'AWS refused the access keys (whole credential), resting 2 min',
  rate_limit_wording: 'rate-limited; no reset named, resting 90 s',
  worded_reset: 'rate-limited; the error text named a reset time',
  account_wide: 'the provider suspended or wants to verify the account',
  no_capacity: 'the provider has no capacity for this model',
  model_gone: 'the provider no longer serves this model',
  prompt_too_long: 'the prompt did not fit the model',
  credential_shaped_4xx: 'the provider refused the credential',
  backoff: 'backing off after failures (2 s doubling to 5 min)',
  auth_or_not_found: 'the provider refused the key (401/402/403/404), resting 2 min',
  server_error: 'the provider had a server error (5xx), resting 30 s',
  request_error: 'the provider refused the request',
  other_failure: 'an unexpected answer, resting 30 s',
};

export function ruleText(rule) {
  return RULES[rule] ? `${RULES[rule]} [${rule}]` : String(rule || 'unknown rule');
}

function targetText(t) {
  if (!t || t === '*') return 'Whole credential';
  if (t === '*:free') return 'All free models';
  return `Model ${t}`;
}

/** The provider's own words (masked by the gateway) in the answer that parked it. */
function said(message) {
  return message ? h('blockquote.said', { title: 'The provider\'s own words (secrets masked)' }, h('span.said-who', 'Provider said: '), message) : null;
}

function statusBlock(u) {
  if (u.banned) {
    return h('div.status.status-banned', badge('banned', 'danger'), ' Banned by an account-wide rule: it gets no traffic until a connection test passes.', said(u.banned_message));
  }
  const locks = u.locks || [];
  if (!locks.length) {
    return h('div.status.status-ready', badge(u.enabled === false ? 'disabled' : 'ready', u.enabled === false ? 'neutral' : 'ok'),
      u.backoff_level ? ` backoff level ${u.backoff_level}` : '');
  }
  return h('div.status.status-parked',
    h('div', badge('parked', 'warn'), ' Resumes ', h('strong', countdown(u.resumes_at, 'now — refresh to confirm')), ' at ', h('time', { datetime: u.resumes_at }, fmtTime(u.resumes_at))),
    h('ul.locks', locks.map((l) => h('li', `${targetText(l.target)}: ${ruleText(l.rule)} — until `, h('time', { datetime: l.until }, fmtTime(l.until)), ' (', countdown(l.until, 'ended'), ')', said(l.message)))));
}

/** A credential's last 24 hours (GET /upstreams/figures): what new-api users judge a channel by. */
function figuresBlock(f) {
  if (!f) return null;
  const rate = f.error_rate === null || f.error_rate === undefined ? '—' : `${(f.error_rate * 100).toFixed(f.error_rate > 0 && f.error_rate < 0.1 ? 1 : 0)} %`;
  const item = (label, value, title) => h('div', { title }, h('dt', label), h('dd', value));
  return [
    h('p.figures-head', 'Last 24 hours'),
    h('dl.figures', { 'aria-label': `Last 24 hours of ${f.name}` },
      item('Attempts', fmtNum(f.attempts), 'Requests sent to this credential, retries and failovers included'),
      item('Failed', rate, 'Attempts with no answer or a status of 400 or more'),
      item('Served', fmtNum(f.served), 'Requests it answered with success'),
      item('Latency', f.mean_latency_ms === null || f.mean_latency_ms === undefined ? '—' : `${fmtNum(f.mean_latency_ms)} ms`, `Mean latency of the requests it served; ${f.mean_upstream_ms === null || f.mean_upstream_ms === undefined ? 'no' : `${fmtNum(f.mean_upstream_ms)} ms`} until its response headers`),
      item('Parked', f.parked_seconds ? fmtDuration(f.parked_seconds * 1000) : 'never', 'Time at least one lock parked a model or all of it'))];
}

function limitsText(l) {
  if (!l) return 'none';
  const parts = [];
  if (l.requests_per_minute) parts.push(`${fmtNum(l.requests_per_minute)} req/min`);
  if (l.tokens_per_minute) parts.push(`${fmtNum(l.tokens_per_minute)} tokens/min`);
  if (l.requests_per_day) parts.push(`${fmtNum(l.requests_per_day)} req/day`);
  return parts.length ? parts.join(', ') : 'none';
}

function modelsText(models) {
  return (models || []).map((m) => (m.upstream && m.upstream !== m.name ? `${m.name} → ${m.upstream}` : m.name)).join(', ') || 'none';
}

/** Parses "name" or "name=upstream" lines. */
function parseModels(text) {
  return text.split(/[\n,]/).map((s) => s.trim()).filter(Boolean).map((line) => {
    const [name, upstream] = line.split('=').map((s) => s.trim());
    return upstream ? { name, upstream } : { name };
  });
}

async function editUpstream(u) {
  const creating = !u;
  u = u || { provider: 'openai', models: [], limits: {}, enabled: true, priority: 0, weight: 1 };
  return dialog(creating ? 'New upstream credential' : `Edit ${u.name}`, (close) => {
    const num = (name, value, attrs = {}) => h('input', { type: 'number', name, min: 0, step: 1, value: value ?? '', inputmode: 'numeric', ...attrs });
    // Six columns: identity and secret two by two, numbers three by three, each group under
    // its heading; one column on a phone.
    const at = (span, el) => { el.classList.add(span); return el; };
    // A bedrock credential signs with AWS keys instead of an API key: the fields follow the provider.
    const apiKeyInput = h('input', {
      name: 'api_key', type: 'password', autocomplete: 'new-password', required: creating, value: '',
      placeholder: creating ? 'The provider key' : 'Unchanged — type a new key to replace it',
    });
    const apiKeyField = at('span-3', field('API key (secret)', apiKeyInput,
      creating ? 'Stored encrypted; it is never shown again.' : 'Never shown. Replacing it clears per-model locks.'));
    const aws = u.aws || {};
    const secretInput = (name, placeholder) => h('input', { name, type: 'password', autocomplete: 'new-password', value: '', placeholder });
    const awsFields = [
      at('span-3', field('AWS region', h('input', { name: 'region', value: aws.region || '', placeholder: 'us-east-1', autocomplete: 'off' }), 'The endpoint is bedrock-runtime.REGION.amazonaws.com unless a base URL is given.')),
      at('span-3', field('Access key id', h('input', { name: 'access_key_id', value: aws.access_key_id || '', placeholder: 'AKIA…', autocomplete: 'off' }))),
      at('span-3', field('Secret access key (secret)', secretInput('secret_access_key', creating ? 'The AWS secret key' : 'Unchanged — type a new key to replace it'), 'Stored encrypted; it is never shown again.')),
      at('span-3', field('Session token (secret, optional)', secretInput('session_token', aws.has_session_token ? 'Set — type a new one to replace it' : 'Only for temporary credentials'), 'For temporary (ASIA…) credentials.')),
    ];
    const providerSelect = select('provider', PROVIDERS, u.provider);
    const showProvider = () => {
      const bedrock = providerSelect.value === 'bedrock';
      apiKeyField.hidden = bedrock;
      apiKeyInput.required = creating && !bedrock;
      for (const f of awsFields) f.hidden = !bedrock;
      for (const name of ['region', 'access_key_id', 'secret_access_key']) {
        const input = awsFields.map((f) => f.querySelector(`[name="${name}"]`)).find(Boolean);
        input.required = bedrock && (creating || name !== 'secret_access_key');
      }
    };
    providerSelect.addEventListener('change', showProvider);
    const form = h('form.form.form-grid',
      managedWarning(u),
      at('span-3', field('Name', h('input', { name: 'name', required: true, value: u.name || '', autocomplete: 'off' }))),
      at('span-3', field('Provider', providerSelect)),
      at('span-3', field('Base URL', h('input', { name: 'base_url', type: 'url', value: u.base_url || '', placeholder: 'https://api.openai.com/v1' }), 'Empty: the provider\'s own address. Azure: https://NAME.openai.azure.com, with ?api-version= to pin a version, or …/openai/v1. Bedrock: empty for the region\'s endpoint.')),
      apiKeyField,
      ...awsFields,
      field('Models', h('textarea', { name: 'models', rows: 3, required: true, value: (u.models || []).map((m) => (m.upstream && m.upstream !== m.name ? `${m.name}=${m.upstream}` : m.name)).join('\n') }),
        'One per line: the public model name, or name=upstream-name.'),
      h('h3.form-section', 'Routing'),
      at('span-2', field('Priority', num('priority', u.priority ?? 0), 'Lower is tried first.')),
      at('span-2', field('Weight', num('weight', u.weight ?? 1, { min: 1 }), 'Spreads load within a priority.')),
      at('span-2', field('Max in flight', num('max_in_flight', u.max_in_flight ?? '', { min: 1 }), 'Empty: no limit.')),
      h('h3.form-section', 'Own limits ', h('small.muted', '(empty: none)')),
      at('span-2', field('Requests per minute', num('limits.requests_per_minute', u.limits?.requests_per_minute ?? '', { min: 1 }))),
      at('span-2', field('Tokens per minute', num('limits.tokens_per_minute', u.limits?.tokens_per_minute ?? '', { min: 1 }))),
      at('span-2', field('Requests per day', num('limits.requests_per_day', u.limits?.requests_per_day ?? '', { min: 1 }))),
      at('span-3', field('Quota group', h('input', { name: 'quota_group', value: u.quota_group || '', autocomplete: 'off' }), 'Credentials sharing one account quota rest together.')),
      h('div.actions.with-option',
        h('div.field.checkbox', h('label', { title: 'A disabled credential gets no traffic.' }, h('input', { type: 'checkbox', name: 'enabled', checked: u.enabled !== false }), ' Enabled')),
        h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, creating ? 'Create upstream' : 'Save')));
    showProvider();
    handleSubmit(form, {
      validate: (fd) => {
        const errors = {};
        if (!parseModels(fd.get('models')).length) errors.models = 'Name at least one model this credential serves.';
        if (parseModels(fd.get('models')).some((m) => !/^[\w.:/@-]+$/.test(m.name))) errors.models = 'Model names have no spaces.';
        if (!fd.get('name').trim()) errors.name = 'A name is required.';
        return errors;
      },
      send: async (fd) => {
        const opt = (k) => (fd.get(k) === '' ? null : Number(fd.get(k)));
        const body = {
          name: fd.get('name').trim(),
          provider: fd.get('provider'),
          base_url: fd.get('base_url').trim() || null,
          models: parseModels(fd.get('models')),
          priority: opt('priority') ?? 0,
          weight: opt('weight') ?? 1,
          max_in_flight: opt('max_in_flight'),
          limits: { requests_per_minute: opt('limits.requests_per_minute'), tokens_per_minute: opt('limits.tokens_per_minute'), requests_per_day: opt('limits.requests_per_day') },
          quota_group: fd.get('quota_group').trim() || null,
          enabled: fd.get('enabled') === 'on',
        };
        if (body.provider === 'bedrock') {
          body.region = fd.get('region').trim();
          body.access_key_id = fd.get('access_key_id').trim();
          if (fd.get('secret_access_key')) body.secret_access_key = fd.get('secret_access_key');
          if (fd.get('session_token')) body.session_token = fd.get('session_token');
        } else if (fd.get('api_key')) body.api_key = fd.get('api_key');
        if (creating) {
          if (!body.base_url) delete body.base_url;
          if (body.max_in_flight === null) delete body.max_in_flight;
          await api.post('/upstreams', body);
          toast(`Upstream ${body.name} created.`);
        } else {
          await api.patch(`/upstreams/${u.id}`, body);
          toast(`Upstream ${body.name} saved.`);
        }
        close(true);
      },
    });
    return form;
  }, { wide: true });
}

export default {
  title: 'Upstreams',
  roles: ['owner', 'admin'],
  async render(main) {
    const body = h('div.cards', { 'aria-live': 'polite' }, h('p.loading', 'Loading upstreams…'));
    const newBtn = h('button.primary', { type: 'button' }, 'New upstream');
    const updated = h('small.muted');
    clear(main,
      pageHeader('Upstreams', newBtn),
      h('p.muted', 'Provider credentials the gateway routes to. A failing credential is parked by the rule that matched and resumes on its own; Test connection clears its locks at once.'),
      updated,
      body);
    const results = new Map(); // id → last test result element

    const load = async () => {
      try {
        const [ups, figures] = await Promise.all([api.list('/upstreams'), api.get('/upstreams/figures').catch(() => null)]);
        const figuresOf = (u) => (figures?.data || []).find((f) => f.upstream_id === u.id);
        updated.textContent = `Updated ${fmtTime(Date.now())}`;
        clear(body, ups.length ? ups.map((u) => {
          const result = results.get(u.id) || h('div.test-result', { role: 'status' });
          results.set(u.id, result);
          const test = h('button.primary.small', {
            type: 'button',
            'aria-label': `Test connection of ${u.name}`,
            onclick: (e) => busy(e.currentTarget, async () => {
              clear(result, 'Testing…');
              try {
                const r = await api.post(`/upstreams/${u.id}/test`);
                clear(result, r.ok
                  ? alertBox('success', `Connection OK (HTTP ${r.status}, ${fmtNum(r.latency_ms)} ms).${r.cleared ? ' Locks cleared.' : ''}`)
                  : alertBox('error', `Connection failed${r.status ? ` (HTTP ${r.status})` : ''}: ${r.error || 'no details'}`));
              } catch (err) {
                clear(result, alertBox('error', messageOf(err)));
              }
              await load();
            }),
          }, 'Test connection');
          return h('article.card.upstream', { dataset: { name: u.name }, 'aria-label': `Upstream ${u.name}` },
            h('div.card-head', h('h2', u.name), managedBadge(u), h('span.muted', PROVIDERS.find(([p]) => p === u.provider)?.[1] || u.provider)),
            statusBlock(u),
            figuresBlock(figuresOf(u)),
            h('dl.kv',
              h('dt', 'Base URL'), h('dd', h('code', u.base_url || 'default')),
              h('dt', 'Models'), h('dd', modelsText(u.models)),
              h('dt', 'Priority / weight'), h('dd', `${u.priority ?? 0} / ${u.weight ?? 1}`),
              h('dt', 'Max in flight'), h('dd', u.max_in_flight ? fmtNum(u.max_in_flight) : 'no limit'),
              h('dt', 'Limits'), h('dd', limitsText(u.limits)),
              h('dt', 'Quota group'), h('dd', u.quota_group || 'none'),
              h('dt', 'Secret'), h('dd', h('span.muted', 'stored encrypted, write-only'))),
            h('div.row-actions',
              test,
              h('button.small', { type: 'button', 'aria-label': `Edit ${u.name}`, onclick: async () => { if (await editUpstream(u)) load(); } }, 'Edit'),
              h('button.small.danger', {
                type: 'button',
                'aria-label': `Delete ${u.name}`,
                onclick: (e) => busy(e.currentTarget, async () => {
                  if (!(await confirmDialog('Delete upstream', `Delete the credential "${u.name}"? Models it serves fail over to the others.${u.managed_by ? ` ${MANAGED_TEXT}` : ''}`))) return;
                  await api.del(`/upstreams/${u.id}`);
                  toast(`Upstream ${u.name} deleted.`);
                  load();
                }),
              }, 'Delete')),
            result);
        }) : h('p.empty', 'No upstream credentials yet. Add one so the gateway can serve models.'));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    newBtn.addEventListener('click', async () => { if (await editUpstream(null)) load(); });
    await load();
    const timer = setInterval(() => { if (idle(body)) load(); }, 10000);
    return () => clearInterval(timer);
  },
};
