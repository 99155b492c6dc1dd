// Usage: requests, tokens and credits by day (columns) and by key and by model (bars), drawn
// as plain SVG, each with a table of the same figures for those who would rather read.

import { api } from '../api.js';
import { h, clear, alertBox, messageOf, fmtNum, fmtTime, select, field, pageHeader, table } from '../ui.js';

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const METRICS = [['requests', 'Requests'], ['total_tokens', 'Tokens'], ['credits', 'Credits']];
const RANGES = [['7', 'Last 7 days'], ['30', 'Last 30 days'], ['90', 'Last 90 days']];

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

/** Vertical columns, one per day. */
function columnChart(rows, metric, title) {
  const W = 900; const H = 260; const L = 48; const B = 28; const T = 10;
  const max = niceMax(Math.max(0, ...rows.map((r) => Number(r[metric]) || 0)));
  const bw = rows.length ? (W - L - 8) / rows.length : 0;
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': title });
  svg.append(s('title', {}, title));
  for (let i = 0; i <= 4; i += 1) {
    const y = T + ((H - T - B) * i) / 4;
    svg.append(s('line', { x1: L, x2: W, y1: y, y2: y, class: 'gridline' }));
    svg.append(s('text', { x: L - 6, y: y + 4, class: 'axis', 'text-anchor': 'end' }, fmtNum(max * (1 - i / 4))));
  }
  const step = Math.ceil(rows.length / 10);
  rows.forEach((r, i) => {
    const v = Number(r[metric]) || 0;
    const bh = ((H - T - B) * v) / max;
    const x = L + i * bw + bw * 0.15;
    svg.append(s('rect', { x, y: H - B - bh, width: Math.max(1, bw * 0.7), height: bh, class: 'col' }, s('title', {}, `${r.label || r.group}: ${fmtNum(v)}`)));
    if (i % step === 0) svg.append(s('text', { x: x + bw * 0.35, y: H - 8, class: 'axis', 'text-anchor': 'middle' }, String(r.label || r.group).slice(5)));
  });
  return svg;
}

/** Horizontal bars, largest first. */
function barChart(rows, metric, title) {
  const sorted = [...rows].sort((a, b) => (Number(b[metric]) || 0) - (Number(a[metric]) || 0)).slice(0, 12);
  const W = 460; const row = 26; const L = 170; const H = sorted.length * row + 8;
  const max = Math.max(1e-9, ...sorted.map((r) => Number(r[metric]) || 0));
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': title });
  svg.append(s('title', {}, title));
  sorted.forEach((r, i) => {
    const v = Number(r[metric]) || 0;
    const y = 4 + i * row;
    const w = ((W - L - 60) * v) / max;
    const label = String(r.label || r.group || '—');
    svg.append(s('text', { x: L - 8, y: y + 16, class: 'axis', 'text-anchor': 'end' }, label.length > 26 ? `${label.slice(0, 25)}…` : label));
    svg.append(s('rect', { x: L, y: y + 3, width: Math.max(1, w), height: row - 8, class: 'bar-h' }, s('title', {}, `${label}: ${fmtNum(v)}`)));
    svg.append(s('text', { x: L + w + 6, y: y + 16, class: 'value' }, fmtNum(v)));
  });
  return svg;
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
    { label: first, cell: (r) => String(r.label || r.group || '—') },
    { label: 'Requests', cell: (r) => fmtNum(r.requests) },
    { label: 'Prompt tokens', cell: (r) => fmtNum(r.prompt_tokens) },
    { label: 'Completion tokens', cell: (r) => fmtNum(r.completion_tokens) },
    { label: 'Credits', cell: (r) => fmtNum(r.credits) },
  ], rows, { empty: 'No usage in this range.', caption: `Usage by ${first.toLowerCase()}` });
}

export default {
  title: 'Usage',
  async render(main, ctx) {
    const metric = select('metric', METRICS, 'requests');
    const range = select('range', RANGES, '30');
    const controls = h('form.filters', { 'aria-label': 'Chart options', onsubmit: (e) => e.preventDefault() }, field('Show', metric), field('Range', range));
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
        h('div.grid.grid-2',
          section(`By key`, barChart(data.key, m, `${mName} by key`), data.key, 'Key'),
          section(`By model`, barChart(data.model, m, `${mName} by model`), data.model, 'Model')));
    };
    const load = async () => {
      const days = Number(range.value);
      const q = { from: Date.now() - days * 86400e3, to: Date.now() };
      try {
        const [day, key, model] = await Promise.all(['day', 'key', 'model'].map((by) => api.get('/usage', { by, ...q }).then((r) => r.data || [])));
        data = { day: fillDays(day, days), key, model };
        draw();
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    metric.addEventListener('change', draw);
    range.addEventListener('change', load);
    await load();
  },
};
