// Small DOM and formatting helpers shared by the pages: an element builder, messages, dialogs,
// form validation, tables, bars and countdowns. Text always goes in as text, never as HTML.

import { ApiError } from './api.js';

/** h('button.primary', {onclick}, 'Save') — tag with optional .classes and #id. */
export function h(spec, attrs, ...children) {
  if (attrs === null || typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs)) {
    if (attrs !== undefined && attrs !== null) children.unshift(attrs);
    attrs = {};
  }
  const [, tag = 'div', rest = ''] = spec.match(/^([a-z0-9-]*)(.*)$/i) || [];
  const el = document.createElement(tag || 'div');
  for (const part of rest.match(/[.#][^.#]+/g) || []) {
    if (part[0] === '.') el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.classList.add(...String(v).split(/\s+/).filter(Boolean));
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k === 'value') {
      // The default (kept by form.reset()) and the current value; a textarea's default is its text.
      if (el instanceof HTMLTextAreaElement) el.defaultValue = String(v);
      else el.setAttribute('value', String(v));
      el.value = String(v);
    }
    else if (k in el && typeof v !== 'string' && k !== 'list') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** The message to show for any thrown value. */
export function messageOf(err) {
  if (err instanceof ApiError) return err.message;
  if (err && err.message) return `Something went wrong in the console: ${err.message}`;
  return 'Something went wrong.';
}

/** An inline alert box. kind: error | success | info | warn. */
export function alertBox(kind, ...content) {
  return h(`div.alert.alert-${kind}`, { role: kind === 'error' ? 'alert' : 'status' }, ...content);
}

/** A short-lived notice over the top bar (the newest replaces the one shown). */
export function toast(message, kind = 'success') {
  let host = document.getElementById('toasts');
  if (!host) {
    host = h('div#toasts.toasts', { 'aria-live': 'polite' });
    document.body.append(host);
  }
  const t = h(`div.toast.toast-${kind}`, { role: kind === 'error' ? 'alert' : 'status' }, message);
  host.replaceChildren(t);
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000);
}

/** Runs an async action from a button: disables it meanwhile, shows errors as a toast. */
export async function busy(button, fn) {
  const was = button.disabled;
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    return await fn();
  } catch (err) {
    toast(messageOf(err), 'error');
    return undefined;
  } finally {
    button.disabled = was;
    button.removeAttribute('aria-busy');
  }
}

// ---------------------------------------------------------------- dialogs

/**
 * Opens a modal dialog. `build(close)` returns its body; resolves with what close() is given
 * (undefined when dismissed with Escape or the close button).
 */
export function dialog(title, build, { wide = false } = {}) {
  return new Promise((resolve) => {
    const titleId = `dlg-${Math.random().toString(36).slice(2)}`;
    const dlg = h(`dialog.dialog${wide ? '.wide' : ''}`, { 'aria-labelledby': titleId });
    let result;
    const close = (value) => { result = value; dlg.close(); };
    dlg.addEventListener('close', () => { dlg.remove(); resolve(result); });
    const head = h('header.dialog-head',
      h('h2', { id: titleId }, title),
      h('button.icon-button', { type: 'button', 'aria-label': 'Close', onclick: () => close(undefined) }, '×'));
    dlg.append(head, h('div.dialog-body', build(close)));
    document.body.append(dlg);
    dlg.showModal();
    const first = dlg.querySelector('.dialog-body input:not([type=hidden]), .dialog-body select, .dialog-body textarea, .dialog-body button');
    if (first) first.focus();
  });
}

export async function confirmDialog(title, text, { confirm = 'Delete', danger = true } = {}) {
  return dialog(title, (close) => [
    h('p', text),
    h('div.actions',
      h('button', { type: 'button', onclick: () => close(false) }, 'Cancel'),
      h(`button.${danger ? 'danger' : 'primary'}`, { type: 'button', onclick: () => close(true) }, confirm)),
  ]).then((v) => v === true);
}

// Entities the resources file declares (`managed_by: "resources_file"`): the gateway applies the
// file at every start, so an edit made here is undone then. Marked in lists, warned before edits.
export const MANAGED_TEXT = 'Declared in the resources file, which the gateway applies at every start: a change made here is undone at the next start. Change the file to keep it.';

/** A "resources file" badge for an entity the file declares, else nothing. */
export function managedBadge(entity) {
  return entity?.managed_by ? badge('resources file', 'info', MANAGED_TEXT) : null;
}

/** The warning shown in an edit dialog of an entity the file declares, else nothing. */
export function managedWarning(entity) {
  return entity?.managed_by ? alertBox('warn', MANAGED_TEXT) : null;
}

/** Asks before changing an entity the file declares; true at once for any other. */
export async function confirmManaged(entity, what) {
  if (!entity?.managed_by) return true;
  return confirmDialog('Managed by the resources file', `${what}: ${MANAGED_TEXT}`, { confirm: 'Change anyway', danger: false });
}

/** Shows a secret once, with a copy button. */
export function secretDialog(title, intro, secret, label = 'Secret') {
  return dialog(title, (close) => {
    const out = h('input.secret-value', { type: 'text', readOnly: true, value: secret, 'aria-label': label, spellcheck: false });
    const status = h('span.copy-status', { role: 'status' });
    const copy = h('button.primary', {
      type: 'button',
      onclick: async () => {
        const ok = await copyText(secret, out);
        status.textContent = ok ? 'Copied to the clipboard.' : 'Select the text and copy it yourself.';
        copy.textContent = ok ? 'Copied' : 'Copy';
      },
    }, 'Copy');
    return [
      h('p', intro),
      h('div.secret-row', out, copy),
      status,
      h('p.hint', 'It will not be shown again. Store it somewhere safe now.'),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Done')),
    ];
  });
}

export async function copyText(text, input) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    if (input) {
      input.focus();
      input.select();
      try { return document.execCommand('copy'); } catch { return false; }
    }
    return false;
  }
}

// ---------------------------------------------------------------- forms

let fieldSeq = 0;

/** A labelled field. control is an element; hint optional. */
export function field(label, control, hint) {
  const id = control.id || `f${++fieldSeq}`;
  control.id = id;
  const hintEl = hint ? h('small.hint', { id: `${id}-hint` }, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div.field', { dataset: { name: control.name || '' } }, h('label', { for: id }, label), control, hintEl);
}

export function select(name, options, value, attrs = {}) {
  return h('select', { name, ...attrs },
    options.map((o) => {
      const [v, text] = Array.isArray(o) ? o : [o, o];
      return h('option', { value: v, selected: String(v) === String(value ?? '') }, text);
    }));
}

/**
 * Wires a form: validate() returns {field: message} or a string; send() does the work.
 * Browser constraints are checked first; errors appear next to fields and in a summary; an
 * ApiError with `param` is put next to that field.
 */
export function handleSubmit(form, { validate, send }) {
  const summary = h('div.form-error', { role: 'alert', hidden: true });
  form.prepend(summary);
  form.noValidate = true;
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    clearErrors(form, summary);
    const errors = {};
    for (const el of form.elements) {
      if (el.willValidate && !el.checkValidity()) errors[el.name || el.id] = el.validationMessage;
    }
    const extra = Object.keys(errors).length ? {} : (validate ? validate(new FormData(form)) : null);
    if (typeof extra === 'string') errors._ = extra;
    else Object.assign(errors, extra || {});
    if (Object.keys(errors).length) {
      showErrors(form, summary, errors);
      return;
    }
    const submit = form.querySelector('[type=submit]');
    if (submit) submit.disabled = true;
    try {
      await send(new FormData(form));
    } catch (err) {
      const errs = {};
      if (err instanceof ApiError && err.param && form.elements.namedItem(err.param)) errs[err.param] = err.message;
      else errs._ = messageOf(err);
      showErrors(form, summary, errs);
    } finally {
      if (submit) submit.disabled = false;
    }
  });
  return form;
}

function clearErrors(form, summary) {
  summary.hidden = true;
  summary.textContent = '';
  form.querySelectorAll('.field-error').forEach((e) => e.remove());
  form.querySelectorAll('[aria-invalid]').forEach((e) => e.removeAttribute('aria-invalid'));
}

function showErrors(form, summary, errors) {
  const lines = [];
  let focus = null;
  for (const [name, msg] of Object.entries(errors)) {
    const el = name === '_' ? null : form.elements.namedItem(name);
    const ctl = el && (el instanceof RadioNodeList ? el[0] : el);
    if (ctl && ctl.closest) {
      ctl.setAttribute('aria-invalid', 'true');
      const wrap = ctl.closest('.field') || ctl.parentElement;
      wrap.append(h('small.field-error', msg));
      const label = wrap.querySelector('label, legend');
      lines.push(label ? `${label.textContent}: ${msg}` : msg);
      focus = focus || ctl;
    } else {
      lines.push(msg);
    }
  }
  summary.replaceChildren(...lines.map((l) => h('div', l)));
  summary.hidden = false;
  (focus || summary).focus?.();
}

// ---------------------------------------------------------------- tables and widgets

/**
 * A table: columns [{label, cell(row) → node|text, class?}]. It fits its box (long words
 * break rather than push it wider); on phones each row becomes a card of labelled cells, or
 * the page's own card layout when `kind` names one (e.g. `log-table`).
 */
export function table(columns, rows, { empty = 'Nothing here yet.', caption, kind } = {}) {
  if (!rows.length) return h('p.empty', empty);
  return h('div.table-wrap', { class: kind, tabindex: 0, role: 'region', 'aria-label': caption || 'Table' },
    h('table',
      caption ? h('caption.visually-hidden', caption) : null,
      h('thead', h('tr', columns.map((c) => h('th', { scope: 'col', class: c.class }, c.label)))),
      h('tbody', rows.map((r) => h('tr', columns.map((c) => h('td', { class: c.class, dataset: { label: c.label } }, h('div.cell', c.cell(r)))))))));
}

/** Text that may break after "/", "@", "_" and "." (emails, key names, codes) rather than anywhere. */
export function breakable(text) {
  return String(text).split(/(?<=[/@_.])/).flatMap((part, i) => (i ? [h('wbr'), part] : [part]));
}

/** A used/limit bar. */
export function bar(used, limit, label) {
  const frac = limit > 0 ? Math.min(1, used / limit) : (used > 0 ? 1 : 0);
  const pct = Math.round(frac * 100);
  const level = frac >= 1 ? 'full' : frac >= 0.8 ? 'high' : 'ok';
  return h(`div.bar.bar-${level}`, { role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': pct, 'aria-label': label || 'Used' },
    h('span', { style: { width: `${pct}%` } }));
}

export function badge(text, kind = 'neutral', title) {
  return h(`span.badge.badge-${kind}`, { title }, text);
}

export function loading(text = 'Loading…') {
  return h('p.loading', { role: 'status' }, text);
}

export function pageHeader(title, ...actions) {
  return h('div.page-head', h('h1', { tabindex: -1 }, title), h('div.page-actions', ...actions));
}

// ---------------------------------------------------------------- time

let zone = 'UTC';
export function setZone(tz) {
  try { new Intl.DateTimeFormat('en', { timeZone: tz }); zone = tz; } catch { zone = 'UTC'; }
}
export function getZone() { return zone; }

function toDate(v) {
  if (v === null || v === undefined || v === '') return null;
  const d = typeof v === 'number' ? new Date(v) : new Date(String(v));
  return Number.isNaN(d.getTime()) ? null : d;
}

/** "2026-12-02 00:01:27" in the workspace time zone. */
export function fmtTime(v, { seconds = true } = {}) {
  const d = toDate(v);
  if (!d) return '—';
  const parts = new Intl.DateTimeFormat('en-CA', {
    timeZone: zone, year: 'numeric', month: '2-digit', day: '2-digit',
    hour: '2-digit', minute: '2-digit', second: seconds ? '2-digit' : undefined, hourCycle: 'h23',
  }).formatToParts(d);
  const p = Object.fromEntries(parts.map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}${seconds ? `:${p.second}` : ''}`;
}

/** fmtTime without the year when it is the current one: "12-02 10:27:56". */
export function fmtRecent(v, opts) {
  const t = fmtTime(v, opts);
  return t.length > 10 && t.slice(0, 4) === fmtTime(Date.now()).slice(0, 4) ? t.slice(5) : t;
}

/** A <time> element (never broken over lines): fmtRecent of `v`, the full time as its title. */
export function dateTime(v, opts) {
  const d = toDate(v);
  if (!d) return h('span.muted', '—');
  return h('time', { datetime: d.toISOString(), title: fmtTime(d) }, fmtRecent(d, opts));
}

/** Milliseconds → "1h 02m", "3m 05s", "42s". */
export function fmtDuration(ms) {
  let s = Math.max(0, Math.ceil(ms / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hr = Math.floor(s / 3600); s -= hr * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${String(m).padStart(2, '0')}m`;
  if (m) return `${m}m ${String(s).padStart(2, '0')}s`;
  return `${s}s`;
}

/**
 * A live countdown to `until` (RFC 3339 or ms); the app's ticker updates every [data-until]
 * once a second. `done` is shown when the moment has passed.
 */
export function countdown(until, done = 'now') {
  const d = toDate(until);
  const el = h('span.countdown', { dataset: { until: d ? String(d.getTime()) : '', done }, title: d ? fmtTime(d) : '' });
  tickOne(el, Date.now());
  return el;
}

export function tickOne(el, now) {
  const until = Number(el.dataset.until);
  if (!until) { el.textContent = '—'; return; }
  const left = until - now;
  el.textContent = left > 0 ? `in ${fmtDuration(left)}` : el.dataset.done;
  el.classList.toggle('expired', left <= 0);
}

export function tickAll() {
  const now = Date.now();
  document.querySelectorAll('[data-until]').forEach((el) => tickOne(el, now));
}

// ---------------------------------------------------------------- numbers

export function fmtNum(v) {
  if (v === null || v === undefined || v === '') return '—';
  const n = Number(v);
  if (!Number.isFinite(n)) return String(v);
  return n.toLocaleString('en-US', { maximumFractionDigits: Number.isInteger(n) ? 0 : 6 });
}

export function fmtCredits(v) {
  if (v === null || v === undefined) return '—';
  const n = Number(v);
  if (!Number.isFinite(n)) return String(v);
  return n.toLocaleString('en-US', { maximumFractionDigits: 6 });
}

export const METRICS = [
  ['requests', 'Requests'],
  ['total_tokens', 'Total tokens'],
  ['prompt_tokens', 'Prompt tokens'],
  ['completion_tokens', 'Completion tokens'],
  ['credits', 'Credits'],
];

/** The unit a metric counts in, for figures: "requests", "tokens", "credits"… */
export function metricUnit(m) {
  return { requests: 'requests', total_tokens: 'tokens', prompt_tokens: 'prompt tokens', completion_tokens: 'completion tokens', credits: 'credits' }[m] || m;
}

export function metricLabel(m) {
  const f = METRICS.find(([k]) => k === m);
  return f ? f[1] : m;
}

/** "day" → "per day", "5minutes" → "per 5 minutes", "total" → "in total". */
export function windowLabel(w) {
  if (!w) return '';
  if (w === 'total') return 'in total';
  if (w === 'minute' || w === 'day' || w === 'week' || w === 'month') return `per ${w}`;
  const m = /^(\d+)minutes$/.exec(w);
  return m ? `per ${m[1]} minutes` : w;
}

/** Whether a periodic refresh may redraw `el`: no dialog open and the keyboard focus elsewhere. */
export function idle(el) {
  return !document.querySelector('dialog[open]') && !el.contains(document.activeElement);
}
