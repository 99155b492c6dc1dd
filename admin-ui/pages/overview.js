// Overview: for owners and admins first what needs attention in the workspace (quotas near or
// at their limit, parked credentials, blocked keys), then the "My quota" card (every quota
// that applies to me, refreshed every few seconds), today's traffic and the upstream pool.

import { api } from '../api.js';
import {
  h, clear, bar, badge, alertBox, messageOf, fmtNum, fmtCredits, fmtTime, countdown, metricLabel, metricUnit, windowLabel,
  pageHeader, getZone,
} from '../ui.js';
import { ruleText } from './upstreams.js';

const REFRESH_MS = 4000;
const ATTENTION_REFRESH_MS = 10000;
/** A quota is listed as needing attention from this share of its limit on. */
const NEAR_PERCENT = 80;

function subjectText(q) {
  switch (q.subject) {
    case 'apikey': return `Key ${q.key_name || q.key_id || ''}`.trim();
    case 'member': return 'Me';
    case 'dept': return 'My department';
    case 'ws': return 'Workspace';
    default: return q.subject;
  }
}

const fmtAmount = (metric, v) => (metric === 'credits' ? fmtCredits(v) : fmtNum(v));

export function quotaList(quotas, empty = 'No guardrail applies to you: your requests are not limited by a quota.') {
  if (!quotas.length) return h('p.empty', empty);
  return h('ul.quota-list', quotas.map((q) => {
    const used = Number(q.used) || 0;
    const limit = Number(q.limit) || 0;
    const label = `${subjectText(q)}: ${metricLabel(q.metric).toLowerCase()} ${windowLabel(q.window)}`;
    return h('li.quota', { dataset: { subject: q.subject, metric: q.metric, window: q.window } },
      h('div.quota-head',
        h('span.quota-label', label),
        q.mode === 'shadow' ? badge('shadow', 'info', 'Reported only, never enforced') : null),
      bar(used, limit, label),
      h('div.quota-figures',
        h('span.quota-used', `${fmtAmount(q.metric, used)} / ${fmtAmount(q.metric, limit)} ${metricUnit(q.metric)} used`),
        h('span.quota-remaining', `${fmtAmount(q.metric, q.remaining)} left`),
        // The window's end; `reset_at` (a minute or two later, spread per subject) is for clients.
        h('span.quota-reset', (q.window_end || q.reset_at)
          ? ['Window ends ', h('time', { datetime: q.window_end || q.reset_at, title: fmtTime(q.window_end || q.reset_at) }, fmtTime(q.window_end || q.reset_at, { seconds: false })), ' (', countdown(q.window_end || q.reset_at, 'now'), ')']
          : 'Never resets')));
  }));
}

const SUBJECT_KINDS = { apikey: 'Key', member: 'Member', dept: 'Department', ws: 'Workspace' };

/** One quota near or at its limit (from /quota/standings). */
function quotaItem(s) {
  const full = Number(s.percent) >= 100;
  const what = `${metricLabel(s.metric).toLowerCase()} ${windowLabel(s.window)}`;
  return h('li.attention-item', { dataset: { kind: 'quota', subject: s.subject } },
    h('div.attention-head',
      badge(full ? 'at limit' : `${Math.floor(Number(s.percent))} %`, full ? 'danger' : 'warn'),
      h('span', h('strong', `${SUBJECT_KINDS[s.subject] || s.subject} ${s.subject_name}`), ` — ${what}${s.each ? ' (each)' : ''}`),
      s.mode === 'shadow' ? badge('shadow', 'info', 'Reported only, never enforced') : null),
    h('div.attention-detail',
      bar(Number(s.used), Number(s.limit), `${s.subject_name} ${what}`),
      h('span', `${fmtAmount(s.metric, s.used)} / ${fmtAmount(s.metric, s.limit)} ${metricUnit(s.metric)} used`),
      h('span.muted', (s.window_end || s.reset_at) ? ['window ends ', countdown(s.window_end || s.reset_at, 'now')] : 'never resets')));
}

/** A parked or banned credential (from /upstreams). */
function credentialItem(u) {
  const lock = (u.locks || []).find((l) => l.until === u.resumes_at) || (u.locks || [])[0];
  return h('li.attention-item', { dataset: { kind: 'credential' } },
    h('div.attention-head',
      u.banned ? badge('banned', 'danger') : badge('parked', 'warn'),
      h('span', h('strong', `Credential ${u.name}`), u.banned
        ? ' — banned by an account-wide rule until a connection test passes'
        : [' — resumes ', countdown(u.resumes_at, 'now')])),
    lock && !u.banned ? h('div.attention-detail.muted', ruleText(lock.rule)) : null);
}

/** A key whose breaker is open or that is banned (from /keys). */
function keyItem(k) {
  const b = k.breaker || {};
  const name = k.member_email ? `${k.member_email}/${k.name}` : k.name;
  return h('li.attention-item', { dataset: { kind: 'breaker' } },
    h('div.attention-head',
      b.banned ? badge('banned', 'danger') : badge('blocked', 'warn'),
      h('span', h('strong', `Key ${name}`), b.banned
        ? ' — banned for good by its error-rate breaker'
        : [' — error-rate breaker open, ', countdown(b.blocked_until, 'open again')]),
      h('small.muted', `${b.trips || 0} trip${b.trips === 1 ? '' : 's'}`)));
}

function attentionList(standings, ups, keys) {
  const parked = ups.filter((u) => u.banned || (u.locks && u.locks.length));
  const now = Date.now();
  const broken = keys.filter((k) => k.breaker && (k.breaker.banned || (k.breaker.blocked_until && new Date(k.breaker.blocked_until).getTime() > now)));
  if (!standings.length && !parked.length && !broken.length) {
    return alertBox('success', `Nothing needs attention: no quota is at ${NEAR_PERCENT} % of its limit, every credential is ready and no key is blocked.`);
  }
  const group = (title, href, link, items) => (items.length
    ? h('section.attention-group', h('h3', title, ' ', h('a.small-link', { href }, link)), h('ul.attention-list', items))
    : null);
  return [
    group(`Quotas at ${NEAR_PERCENT} % or more`, '#/guardrails', 'Guardrails', standings.map(quotaItem)),
    group('Credentials not serving', '#/upstreams', 'Upstreams', parked.map(credentialItem)),
    group('Keys blocked by their breaker', '#/keys', 'API keys', broken.map(keyItem)),
  ];
}

export default {
  title: 'Overview',
  async render(main, ctx) {
    const manager = ctx.role !== 'member';
    const quotaBody = h('div', { 'aria-live': 'polite' }, h('p.loading', 'Loading your quota…'));
    const updated = h('small.muted');
    const quotaCard = h('section.card.quota-card', { class: manager ? '' : 'wide-card', 'aria-labelledby': 'my-quota-title' },
      h('div.card-head', h('h2#my-quota-title', 'My quota'), updated),
      quotaBody,
      h('p.hint', `Times are in the workspace time zone, ${getZone()}.`));
    const todayCard = h('section.card', h('h2', 'Today'), h('p.loading', 'Loading…'));
    let attentionCard = null;
    let poolCard = null;
    const cards = [];
    if (manager) {
      attentionCard = h('section.card.wide-card.attention-card', { 'aria-labelledby': 'attention-title' },
        h('h2#attention-title', 'Needs attention'), h('div', { 'aria-live': 'polite' }, h('p.loading', 'Loading…')));
      poolCard = h('section.card', h('h2', 'Upstream pool'), h('p.loading', 'Loading…'));
      cards.push(attentionCard);
    }
    cards.push(quotaCard, todayCard);
    if (poolCard) cards.push(poolCard);
    clear(main, pageHeader('Overview'), h('p.muted', `Signed in as ${ctx.me.email} in ${ctx.workspace.name || 'your workspace'}.`), h('div.grid', cards));

    let stopped = false;
    const loadQuota = async () => {
      try {
        const r = await api.get('/me/quota');
        if (stopped) return;
        clear(quotaBody, quotaList(r.quotas || [], manager
          ? 'No guardrail applies to your own requests. The workspace\'s quotas are under Needs attention and Guardrails.'
          : undefined));
        updated.textContent = `Updated ${fmtTime(Date.now())}`;
      } catch (err) {
        if (!stopped) clear(quotaBody, alertBox('error', messageOf(err)));
      }
    };

    const loadToday = async () => {
      try {
        const r = await api.get('/usage', { by: 'day', from: Date.now() - 24 * 3600e3, to: Date.now() });
        const rows = r.data || [];
        const sum = (k) => rows.reduce((a, x) => a + (Number(x[k]) || 0), 0);
        const stat = (label, value, unit) => h('div', h('dt', label), h('dd', value, unit ? [' ', h('small.stat-unit', unit)] : null));
        clear(todayCard, h('h2', 'Last 24 hours'), h('dl.stats',
          stat('Requests', fmtNum(sum('requests'))),
          stat('Tokens', fmtNum(sum('total_tokens'))),
          stat('Spent', fmtCredits(sum('credits')), 'credits')),
        h('p.hint', 'Credits are counted at each model\'s price per million tokens (see Models).'),
        h('a', { href: '#/usage' }, 'See usage'));
      } catch (err) {
        clear(todayCard, h('h2', 'Last 24 hours'), alertBox('error', messageOf(err)));
      }
    };

    // What needs attention, and the pool's summary from the same list of credentials.
    const loadAttention = async () => {
      if (!attentionCard) return;
      const body = attentionCard.lastElementChild;
      try {
        const [standings, ups, keys] = await Promise.all([
          api.get('/quota/standings', { min_percent: NEAR_PERCENT }).then((r) => r.data || []),
          api.list('/upstreams'),
          api.list('/keys'),
        ]);
        if (stopped) return;
        clear(body, attentionList(standings, ups, keys));
        const ready = ups.filter((u) => u.enabled !== false && !u.banned && !(u.locks && u.locks.length)).length;
        clear(poolCard, h('h2', 'Upstream pool'),
          h('p', `${ready} of ${ups.length} credentials ready.`),
          h('a', { href: '#/upstreams' }, 'Manage upstreams'));
      } catch (err) {
        if (!stopped) clear(body, alertBox('error', messageOf(err)));
      }
    };

    await Promise.all([loadAttention(), loadQuota(), loadToday()]);
    const timers = [setInterval(loadQuota, REFRESH_MS)];
    if (manager) timers.push(setInterval(loadAttention, ATTENTION_REFRESH_MS));
    return () => { stopped = true; timers.forEach(clearInterval); };
  },
};
