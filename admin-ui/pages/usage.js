// Usage: requests, tokens and credits by day (columns, plain SVG), by key, by model, for owners
// and admins by member and by department, and by the values of one tag key (bars, plain HTML),
// each with a table of the same figures for those who would rather read.

import { api } from '../api.js';
import { h, clear, alertBox, messageOf, fmtNum, fmtTime, select, field, pageHeader, table, breakable } from '../ui.js';

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const METRICS = [['requests', 'Requests'], ['total_tokens', 'Tokens'], ['credits', 'Credits']];
const RANGES = [['7', 'Last 7 days'], ['30', 'Last 30 days'], ['90', 'Last 90 days']];

/** The top of an axis of four equal steps above `v`; whole steps for counts. */
function niceMax(v, whole) {
  if (v <= 0) return whole ? 4 : 1;
  const raw = v / 4;
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= raw && (!whole || (m >= 1 && Number.isInteger(m))));
  return 4 * (step || Math.ceil(raw));
}

/** Width of `text` in the chart's font (the axis text is 12 px, like the page's small text). */
let measurer = null;
function textWidth(text) {
  measurer = measurer || document.createElement('canvas').getContext('2d');
  measurer.font = `12px ${getComputedStyle(document.body).fontFamily}`;
  return measurer.measureText(text).width;
}

/**
 * Vertical columns, one per day, drawn at the pixel width of their box (and again whenever it
 * changes), so the axis text keeps its size at every width and the left margin fits the
 * longest axis label.
 */
function columnChart(rows, metric, title) {
  const host = h('div.column-chart');
  const H = 240; const B = 26; const T = 10;
  let drawnAt = 0;
  const draw = () => {
    const W = Math.floor(host.clientWidth);
    if (!W || W === drawnAt) return;
    drawnAt = W;
    const max = niceMax(Math.max(0, ...rows.map((r) => Number(r[metric]) || 0)), metric !== 'credits');
    const ticks = [0, 1, 2, 3, 4].map((i) => fmtNum(max * (1 - i / 4)));
    const L = Math.ceil(Math.max(...ticks.map(textWidth))) + 10;
    const R = 4;
    const bw = rows.length ? (W - L - R) / rows.length : 0;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: 'chart', role: 'img', 'aria-label': title });
    svg.append(s('title', {}, title));
    ticks.forEach((label, i) => {
      const y = T + ((H - T - B) * i) / 4;
      svg.append(s('line', { x1: L, x2: W - R, y1: y, y2: y, class: 'gridline' }));
      svg.append(s('text', { x: L - 6, y: y + 4, class: 'axis', 'text-anchor': 'end' }, label));
    });
    // As many day labels as fit, each centred under its column and kept inside the drawing.
    const labelW = textWidth('00-00') + 12;
    const step = Math.max(1, Math.ceil(rows.length / Math.max(1, Math.floor((W - L - R) / labelW))));
    rows.forEach((r, i) => {
      const v = Number(r[metric]) || 0;
      const bh = ((H - T - B) * v) / max;
      const x = L + i * bw + bw * 0.15;
      svg.append(s('rect', { x, y: H - B - bh, width: Math.max(1, bw * 0.7), height: bh, class: 'col' }, s('title', {}, `${r.label || r.group}: ${fmtNum(v)}`)));
      if (i % step === 0) {
        const cx = Math.min(Math.max(x + bw * 0.35, L + labelW / 2), W - R - labelW / 2);
        svg.append(s('text', { x: cx, y: H - 8, class: 'axis', 'text-anchor': 'middle' }, String(r.label || r.group).slice(5)));
      }
    });
    host.replaceChildren(svg);
  };
  new ResizeObserver(draw).observe(host);
  return host;
}

/** Horizontal bars, largest first: a list whose labels wrap rather than get cut off. */
function barList(rows, metric, title) {
  const sorted = [...rows].sort((a, b) => (Number(b[metric]) || 0) - (Number(a[metric]) || 0)).slice(0, 12);
  const max = Math.max(1e-9, ...sorted.map((r) => Number(r[metric]) || 0));
  return h('ol.hbars', { 'aria-label': title }, sorted.map((r) => {
    const v = Number(r[metric]) || 0;
    const label = String(r.label || r.group || '—');
    return h('li.hbar', { class: r.group === '' ? 'hbar-other' : '' },
      h('span.hbar-label', breakable(label)),
      h('span.hbar-track', h('span.hbar-fill', { style: { width: `${Math.max(0.5, (100 * v) / max)}%` } })),
      h('span.hbar-value', fmtNum(v)));
  }));
}

/** Fills in days with no traffic so the day chart has no gaps. */
function fillDays(rows, days) {
  const by = Object.fromEntries(rows.map((r) => [String(r.label), r]));
  const out = [];
  for (let i = days - 1; i >= 0; i -= 1) {
    const key = fmtTime(Date.now() - i * 86400e3).slice(0, 10); // the day in the workspace zone
    out.push(by[key] || { group: key, label: key, requests: 0, total_tokens: 0, credits: 0, prompt_tokens: 0, completion_tokens: 0 });
  }
  const known = new Set(out.map((r) => r.label));
  return rows.some((r) => !known.has(String(r.label))) ? rows : out;
}

function figures(rows, first) {
  return table([
    { label: first, cell: (r) => breakable(String(r.label || r.group || '—')) },
    { label: 'Requests', class: 'c-num', cell: (r) => fmtNum(r.requests) },
    { label: 'Prompt tokens', class: 'c-num', cell: (r) => fmtNum(r.prompt_tokens) },
    { label: 'Completion tokens', class: 'c-num', cell: (r) => fmtNum(r.completion_tokens) },
    { label: 'Credits', class: 'c-num', cell: (r) => fmtNum(r.credits) },
  ], rows, { empty: 'No usage in this range.', caption: `Usage by ${first.toLowerCase()}` });
}

export default {
  title: 'Usage',
  async render(main, ctx) {
    const metric = select('metric', METRICS, 'requests');
    const range = select('range', RANGES, '30');
    const tagKey = h('input', { name: 'tag_key', autocomplete: 'off', placeholder: 'e.g. team', value: ctx.params.get('tag_key') || '' });
    const controls = h('form.filters', { 'aria-label': 'Chart options', onsubmit: (e) => { e.preventDefault(); load(); } },
      field('Show', metric), field('Range', range), field('By tag', tagKey, 'A tag key from x-aigw-tags: usage per value.'));
    const body = h('div', h('p.loading', 'Loading usage…'));
    clear(main, pageHeader('Usage'), h('p.muted', ctx.role === 'member' ? 'Your usage.' : 'Usage of the whole workspace.'), controls, body);

    let data = null;
    const draw = () => {
      if (!data) return;
      const m = metric.value;
      const mName = METRICS.find(([k]) => k === m)[1].toLowerCase();
      const section = (title, chart, rows, first) => h('section.card.chart-card',
        h('h2', title),
        rows.length ? chart : h('p.empty', 'No usage in this range.'),
        rows.length ? h('details', h('summary', 'Show the figures'), figures(rows, first)) : null);
      clear(body,
        section(`${METRICS.find(([k]) => k === m)[1]} by day`, columnChart(data.day, m, `${mName} by day`), data.day, 'Day'),
        h('div.grid.usage-split',
          section('By key', barList(data.key, m, `${mName} by key`), data.key, 'Key'),
          section('By model', barList(data.model, m, `${mName} by model`), data.model, 'Model')),
        data.member ? h('div.grid.usage-split',
          section('By member', barList(data.member, m, `${mName} by member`), data.member, 'Member'),
          section('By department', barList(data.dept, m, `${mName} by department`), data.dept, 'Department')) : null,
        data.tagKey ? section(`By tag ${data.tagKey}`, barList(data.tag, m, `${mName} by tag ${data.tagKey}`), data.tag, 'Value') : null);
    };
    const load = async () => {
      const days = Number(range.value);
      const q = { from: Date.now() - days * 86400e3, to: Date.now() };
      try {
        const tk = tagKey.value.trim();
        const byTag = /^[a-z0-9_.-]{1,64}$/.test(tk) ? api.get('/usage', { by: 'tag', tag_key: tk, ...q }).then((r) => r.data || []) : Promise.resolve([]);
        const groupings = ctx.role === 'member' ? ['day', 'key', 'model'] : ['day', 'key', 'model', 'member', 'dept'];
        const [tag, day, key, model, member, dept] = await Promise.all([byTag, ...groupings.map((by) => api.get('/usage', { by, ...q }).then((r) => r.data || []))]);
        data = { day: fillDays(day, days), key, model, member, dept, tag, tagKey: tk && /^[a-z0-9_.-]{1,64}$/.test(tk) ? tk : '' };
        draw();
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    metric.addEventListener('change', draw);
    range.addEventListener('change', load);
    tagKey.addEventListener('change', load);
    await load();
  },
};
