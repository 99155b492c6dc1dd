// Overview: the "My quota" card (every quota that applies to me, refreshed every few seconds),
// today's traffic, and for owners and admins the state of the upstream pool.

import { api } from '../api.js';
import { h, clear, bar, badge, alertBox, messageOf, fmtNum, fmtTime, countdown, metricLabel, windowLabel, pageHeader, getZone } from '../ui.js';

const REFRESH_MS = 4000;

function subjectText(q) {
  switch (q.subject) {
    case 'apikey': return `Key ${q.key_name || q.key_id || ''}`.trim();
    case 'member': return 'Me';
    case 'dept': return 'My department';
    case 'ws': return 'Workspace';
    default: return q.subject;
  }
}

export function quotaList(quotas) {
  if (!quotas.length) {
    return h('p.empty', 'No guardrail applies to you: your requests are not limited by a quota.');
  }
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
        h('span.quota-used', `${fmtNum(used)} / ${fmtNum(limit)} used`),
        h('span.quota-remaining', `${fmtNum(q.remaining)} left`),
        h('span.quota-reset', q.reset_at
          ? ['Resets ', h('time', { datetime: q.reset_at }, fmtTime(q.reset_at, { seconds: false })), ' (', countdown(q.reset_at, 'now'), ')']
          : 'Never resets')));
  }));
}

export default {
  title: 'Overview',
  async render(main, ctx) {
    const quotaBody = h('div', { 'aria-live': 'polite' }, h('p.loading', 'Loading your quota…'));
    const updated = h('small.muted');
    const quotaCard = h('section.card.quota-card', { 'aria-labelledby': 'my-quota-title' },
      h('div.card-head', h('h2#my-quota-title', 'My quota'), updated),
      quotaBody,
      h('p.hint', `Times are in the workspace time zone, ${getZone()}.`));
    const todayCard = h('section.card', h('h2', 'Today'), h('p.loading', 'Loading…'));
    const cards = [quotaCard, todayCard];
    let poolCard = null;
    if (ctx.role !== 'member') {
      poolCard = h('section.card', h('h2', 'Upstream pool'), h('p.loading', 'Loading…'));
      cards.push(poolCard);
    }
    clear(main, pageHeader('Overview'), h('p.muted', `Signed in as ${ctx.me.email} in ${ctx.workspace.name || 'your workspace'}.`), h('div.grid', cards));

    let stopped = false;
    const loadQuota = async () => {
      try {
        const r = await api.get('/me/quota');
        if (stopped) return;
        clear(quotaBody, quotaList(r.quotas || []));
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
        clear(todayCard, h('h2', 'Last 24 hours'), h('dl.stats',
          h('div', h('dt', 'Requests'), h('dd', fmtNum(sum('requests')))),
          h('div', h('dt', 'Tokens'), h('dd', fmtNum(sum('total_tokens')))),
          h('div', h('dt', 'Credits'), h('dd', fmtNum(sum('credits'))))),
        h('a', { href: '#/usage' }, 'See usage'));
      } catch (err) {
        clear(todayCard, h('h2', 'Last 24 hours'), alertBox('error', messageOf(err)));
      }
    };

    const loadPool = async () => {
      if (!poolCard) return;
      try {
        const ups = await api.list('/upstreams');
        const parked = ups.filter((u) => u.banned || (u.locks && u.locks.length));
        clear(poolCard, h('h2', 'Upstream pool'),
          h('p', `${ups.length - parked.length} of ${ups.length} credentials ready.`),
          parked.length ? h('ul.plain', parked.map((u) => h('li', h('strong', u.name), ': ',
            u.banned ? 'banned until a connection test passes' : ['parked, resumes ', countdown(u.resumes_at, 'now')]))) : null,
          h('a', { href: '#/upstreams' }, 'Manage upstreams'));
      } catch (err) {
        clear(poolCard, h('h2', 'Upstream pool'), alertBox('error', messageOf(err)));
      }
    };

    await Promise.all([loadQuota(), loadToday(), loadPool()]);
    const timer = setInterval(loadQuota, REFRESH_MS);
    return () => { stopped = true; clearInterval(timer); };
  },
};
