// Guardrails beside quotas on a key or a member: the models it may call (names, or prefixes
// ending in *), the most requests it may have in flight at once (per gateway replica) and, on a
// key, the tags it may send (key=value or key=*).

import { api } from '../api.js';
import { h, dialog, field, handleSubmit, toast, managedWarning } from '../ui.js';

const MODELS_HINT = 'Comma-separated model names or prefixes ending in * (gpt-4o*, claude-*). Blank: every model.';
const IN_FLIGHT_HINT = 'Most requests open at once, on each gateway replica. Blank: no cap.';
const TAGS_HINT = 'Comma-separated tags the key may send in x-aigw-tags: key=value, or key=* for any value (team=search, feature=*). Blank: every tag.';
const TAG_ENTRY = /^[a-z0-9_.-]{1,64}=[\x20-\x2b\x2d-\x7e]{1,128}$/;

/** The two fields, filled with `current` (a key or member as the API shows it). */
export function limitsFields(current = {}, { who = 'key' } = {}) {
  return [
    field('Allowed models', h('input', {
      name: 'allowed_models', autocomplete: 'off', placeholder: 'every model', value: (current.allowed_models || []).join(', '),
    }), who === 'member' ? `${MODELS_HINT} Applies to every key of the member, together with each key's own list.` : MODELS_HINT),
    field('Max in flight', h('input', {
      name: 'max_in_flight', type: 'number', min: 1, max: 1000000, step: 1, inputmode: 'numeric', placeholder: 'no cap', value: current.max_in_flight ?? '',
    }), who === 'member' ? `${IN_FLIGHT_HINT} Counts the member's keys together.` : IN_FLIGHT_HINT),
    who === 'key' ? field('Allowed tags', h('input', {
      name: 'allowed_tags', autocomplete: 'off', placeholder: 'every tag', value: (current.allowed_tags || []).join(', '),
    }), TAGS_HINT) : null,
  ].filter(Boolean);
}

/** The tag list typed in the form: null when blank (every tag), undefined without the field. */
function tagsOf(fd) {
  if (!fd.has('allowed_tags')) return undefined;
  const list = String(fd.get('allowed_tags') || '').split(',').map((t) => t.trim()).filter(Boolean);
  return list.length ? list : null;
}

/** The list typed in the form: null when blank (every model). */
function modelsOf(fd) {
  const list = String(fd.get('allowed_models') || '').split(/[\s,]+/).map((m) => m.trim()).filter(Boolean);
  return list.length ? list : null;
}

/** Checks the two fields before sending: {field: message} or null. */
export function validateLimits(fd) {
  const list = modelsOf(fd) || [];
  const bad = list.find((m) => m.slice(0, -1).includes('*'));
  if (bad) return { allowed_models: `"${bad}": a * may only end a pattern (e.g. gpt-4o*).` };
  if (new Set(list).size !== list.length) return { allowed_models: 'A model is listed twice.' };
  const tags = tagsOf(fd) || [];
  const badTag = tags.find((t) => !TAG_ENTRY.test(t));
  if (badTag) return { allowed_tags: `"${badTag}": write key=value or key=* (key: a-z, 0-9, _ . -).` };
  if (new Set(tags).size !== tags.length) return { allowed_tags: 'A tag is listed twice.' };
  const cap = String(fd.get('max_in_flight') || '').trim();
  if (cap && !(Number.isInteger(Number(cap)) && Number(cap) >= 1 && Number(cap) <= 1000000)) {
    return { max_in_flight: 'A whole number from 1 to 1,000,000, or blank for no cap.' };
  }
  return null;
}

/** The request body's two fields from the form. */
export function limitsBody(fd) {
  const cap = String(fd.get('max_in_flight') || '').trim();
  const body = { allowed_models: modelsOf(fd), max_in_flight: cap ? Number(cap) : null };
  const tags = tagsOf(fd);
  if (tags !== undefined) body.allowed_tags = tags;
  return body;
}

/** The table cell: which models, and the cap. */
export function limitsCell(x) {
  const models = x.allowed_models
    ? h('span.limit-models', { title: 'Allowed models' }, x.allowed_models.join(', '))
    : h('span.muted', 'every model');
  const cap = x.max_in_flight ? h('span.nowrap', `≤ ${x.max_in_flight} in flight`) : h('span.muted.nowrap', 'no cap');
  // A tag a line, so a narrow column breaks between tags, or after a tag's "=", never inside a
  // key or a value.
  const tag = (t, last) => {
    const [k, v] = t.split(/=(.*)/s);
    return h('span.limit-tag', v === undefined ? t : [`${k}=`, h('wbr'), v], last ? '' : ', ');
  };
  const tags = x.allowed_tags
    ? [h('br'), h('span.limit-tags', { title: 'Allowed tags' }, 'tags: ', x.allowed_tags.map((t, i) => tag(t, i === x.allowed_tags.length - 1)))]
    : null;
  return h('div.limits-cell', models, h('br'), cap, tags);
}

/** Edits the limits of `entity` at `path` (PATCH); resolves true when saved. */
export async function editLimits(entity, { title, path, who, what }) {
  const saved = await dialog(title, (close) => {
    const form = h('form.form', managedWarning(entity), ...limitsFields(entity, { who }),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, 'Save limits')));
    handleSubmit(form, {
      validate: validateLimits,
      send: async (fd) => {
        await api.patch(path, limitsBody(fd));
        close(true);
      },
    });
    return form;
  });
  if (saved) toast(`${what}: limits saved.`);
  return Boolean(saved);
}
