// Models: the public model names, their price per million tokens and their fallback chain.
// Everyone reads them; owners and admins create, edit and delete.

import { api } from '../api.js';
import { h, clear, table, alertBox, managedBadge, managedWarning, MANAGED_TEXT, messageOf, fmtCredits, dialog, confirmDialog, field, handleSubmit, toast, busy, pageHeader } from '../ui.js';

function chain(m) {
  return [m.name, ...(m.fallbacks || [])].join(' → ');
}

async function editModel(m, all) {
  const creating = !m;
  m = m || { name: '', fallbacks: [], price: { prompt: 0, completion: 0 } };
  return dialog(creating ? 'New model' : `Edit ${m.name}`, (close) => {
    const others = all.filter((x) => x.name !== m.name).map((x) => x.name);
    const form = h('form.form',
      managedWarning(m),
      field('Name', h('input', { name: 'name', required: true, value: m.name, readOnly: !creating, autocomplete: 'off' }), creating ? 'The name apps send as "model".' : 'Names cannot change; create a new model instead.'),
      field('Prompt price', h('input', { name: 'prompt', type: 'number', min: 0, step: 'any', required: true, value: m.price?.prompt ?? 0 }), 'Credits per million prompt tokens.'),
      field('Completion price', h('input', { name: 'completion', type: 'number', min: 0, step: 'any', required: true, value: m.price?.completion ?? 0 }), 'Credits per million completion tokens.'),
      field('Fallbacks', h('input', { name: 'fallbacks', value: (m.fallbacks || []).join(', '), autocomplete: 'off', list: 'model-names' }),
        `Other models to try, in order, comma-separated.${others.length ? ` Known: ${others.join(', ')}.` : ''}`),
      h('datalist#model-names', others.map((n) => h('option', { value: n }))),
      h('div.actions', h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button.primary', { type: 'submit' }, creating ? 'Create model' : 'Save')));
    handleSubmit(form, {
      validate: (fd) => {
        const errors = {};
        const fb = fd.get('fallbacks').split(',').map((s) => s.trim()).filter(Boolean);
        const unknown = fb.filter((n) => !others.includes(n));
        if (unknown.length) errors.fallbacks = `Unknown model${unknown.length > 1 ? 's' : ''}: ${unknown.join(', ')}.`;
        if (fb.includes(fd.get('name').trim())) errors.fallbacks = 'A model cannot fall back to itself.';
        if (!/^[\w.:/@-]+$/.test(fd.get('name').trim())) errors.name = 'Use a name without spaces.';
        return errors;
      },
      send: async (fd) => {
        const body = {
          fallbacks: fd.get('fallbacks').split(',').map((s) => s.trim()).filter(Boolean),
          price: { prompt: Number(fd.get('prompt')), completion: Number(fd.get('completion')) },
        };
        if (creating) await api.post('/models', { name: fd.get('name').trim(), ...body });
        else await api.patch(`/models/${m.id}`, body);
        toast(creating ? 'Model created.' : 'Model saved.');
        close(true);
      },
    });
    return form;
  });
}

export default {
  title: 'Models',
  async render(main, ctx) {
    const manage = ctx.role !== 'member';
    const newBtn = manage ? h('button.primary', { type: 'button' }, 'New model') : null;
    const body = h('div', h('p.loading', 'Loading models…'));
    clear(main, pageHeader('Models', newBtn),
      h('p.muted', 'Models apps can ask for, what they cost in credits per million tokens, and where a request goes when every credential for a model is parked.'),
      body);
    let models = [];
    const load = async () => {
      try {
        models = await api.list('/models');
        const cols = [
          { label: 'Model', cell: (m) => [h('strong', m.name), ' ', managedBadge(m)] },
          { label: 'Prompt / 1M', cell: (m) => fmtCredits(m.price?.prompt) },
          { label: 'Completion / 1M', cell: (m) => fmtCredits(m.price?.completion) },
          { label: 'Fallback chain', cell: (m) => ((m.fallbacks || []).length ? chain(m) : h('span.muted', 'none')) },
          { label: 'Served by', cell: (m) => ((m.served_by || []).length ? m.served_by.join(', ') : h('span.warn-text', 'no upstream')) },
        ];
        if (manage) {
          cols.push({
            label: 'Actions',
            class: 'actions-cell',
            cell: (m) => [
              h('button.small', { type: 'button', 'aria-label': `Edit ${m.name}`, onclick: async () => { if (await editModel(m, models)) load(); } }, 'Edit'),
              h('button.small.danger', {
                type: 'button',
                'aria-label': `Delete ${m.name}`,
                onclick: (e) => busy(e.currentTarget, async () => {
                  if (!(await confirmDialog('Delete model', `Delete the model "${m.name}"? Apps asking for it get an error.${m.managed_by ? ` ${MANAGED_TEXT}` : ''}`))) return;
                  await api.del(`/models/${m.id}`);
                  toast(`Model ${m.name} deleted.`);
                  load();
                }),
              }, 'Delete'),
            ],
          });
        }
        clear(body, table(cols, models, { empty: 'No models yet.', caption: 'Models' }));
      } catch (err) {
        clear(body, alertBox('error', messageOf(err)));
      }
    };
    if (newBtn) newBtn.addEventListener('click', async () => { if (await editModel(null, models)) load(); });
    await load();
  },
};
