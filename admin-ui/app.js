// The console shell: sign-in, the navigation the role may use, hash routing (#/overview …),
// and the once-a-second ticker for countdowns. Each page is a module in pages/ exporting
// { title, roles, render(main, ctx) } where render may return a cleanup function.

import { api, session, setUnauthorizedHandler } from './api.js';
import { h, clear, alertBox, messageOf, handleSubmit, field, setZone, tickAll, toast } from './ui.js';

import overview from './pages/overview.js';
import guardrails from './pages/guardrails.js';
import alerts from './pages/alerts.js';
import keys from './pages/keys.js';
import upstreams from './pages/upstreams.js';
import models from './pages/models.js';
import logs from './pages/logs.js';
import usage from './pages/usage.js';
import members from './pages/members.js';
import audit from './pages/audit.js';
import settings from './pages/settings.js';

const PAGES = { overview, guardrails, alerts, keys, upstreams, models, logs, usage, members, audit, settings };
const ORDER = ['overview', 'guardrails', 'alerts', 'keys', 'upstreams', 'models', 'logs', 'usage', 'members', 'audit', 'settings'];

const root = document.getElementById('app');
let ctx = null; // { me, role, timezone, workspace, navigate }
let cleanup = null;
let renderSeq = 0;

setUnauthorizedHandler(() => {
  session.clear();
  ctx = null;
  toast('Your session has ended. Please sign in again.', 'error');
  navigate('#/signin');
});

function allowed(page, role) {
  return !page.roles || page.roles.includes(role);
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, qs = ''] = raw.split('?');
  const [name, ...rest] = path.split('/');
  return { name: name || 'overview', args: rest.map(decodeURIComponent), params: new URLSearchParams(qs) };
}

export function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function loadContext() {
  const me = await api.get('/me');
  let timezone = me.workspace && me.workspace.timezone;
  try {
    const ws = await api.get('/workspace');
    timezone = ws.effective_timezone || ws.timezone || timezone;
  } catch { /* older gateways: fall back to /me */ }
  timezone = timezone || 'Asia/Shanghai';
  setZone(timezone);
  return { me, role: me.role, timezone, workspace: me.workspace || {}, navigate };
}

/** The return of a single sign-on (`#sso_token=…` or `#sso_error=…`): the token is kept and the
 *  fragment replaced at once, so it stays in neither the address bar nor the history. */
const SSO_ERRORS = {
  no_access: 'Your account is in no group that gives access to aigw. Ask your administrator.',
  member_disabled: 'Your member account is disabled. Ask your workspace owner.',
  state_mismatch: 'The sign-in could not be verified (it was started in another window or tab). Try again.',
  sign_in_expired: 'The sign-in took too long or was started elsewhere. Try again.',
  token_refused: 'The identity provider’s answer was refused. Ask your administrator to check the gateway’s log.',
  provider_error: 'The identity provider could not be reached or refused the sign-in. Try again shortly.',
  provider_refused: 'The identity provider did not sign you in.',
};
let ssoError = null;

function takeSsoReturn() {
  const m = /^#sso_(token|error)=(.*)$/.exec(location.hash);
  if (!m) return;
  if (m[1] === 'token') {
    session.set(decodeURIComponent(m[2]));
    ctx = null;
  } else {
    ssoError = SSO_ERRORS[m[2]] || 'Single sign-on failed. Try again.';
  }
  history.replaceState(null, '', `${location.pathname}${location.search}#/${m[1] === 'token' ? 'overview' : 'signin'}`);
}

async function route() {
  takeSsoReturn();
  const seq = ++renderSeq;
  if (cleanup) { try { cleanup(); } catch { /* page already gone */ } cleanup = null; }
  const { name, args, params } = parseHash();
  if (!session.token) {
    renderSignIn();
    return;
  }
  if (name === 'signin') { location.replace('#/overview'); return; }
  if (!ctx) {
    clear(root, h('p.loading', { role: 'status' }, 'Loading your workspace…'));
    try {
      ctx = await loadContext();
    } catch (err) {
      if (!session.token) return; // the 401 handler already showed the sign-in
      clear(root, h('main.signin', h('div.card',
        h('h1', 'aigw console'),
        alertBox('error', messageOf(err)),
        h('div.actions',
          h('button', { type: 'button', onclick: () => route() }, 'Try again'),
          h('button', { type: 'button', onclick: signOut }, 'Sign out')))));
      return;
    }
    if (seq !== renderSeq) return;
  }
  const page = PAGES[name];
  renderShell(name);
  const main = document.getElementById('main');
  if (!page) {
    clear(main, h('h1', 'Page not found'), h('p', 'There is no page at this address. ', h('a', { href: '#/overview' }, 'Go to the overview.')));
    return;
  }
  if (!allowed(page, ctx.role)) {
    clear(main, h('h1', page.title), alertBox('error', `Your role (${ctx.role}) cannot open ${page.title}.`));
    return;
  }
  document.title = `${page.title} · aigw console`;
  try {
    const c = await page.render(main, { ...ctx, args, params });
    if (seq === renderSeq) cleanup = typeof c === 'function' ? c : null;
    else if (typeof c === 'function') c();
  } catch (err) {
    if (seq !== renderSeq) return;
    main.append(alertBox('error', messageOf(err)));
  }
  const heading = main.querySelector('h1');
  if (heading && document.activeElement === document.body) heading.focus({ preventScroll: true });
}

function renderShell(active) {
  const links = ORDER.filter((n) => allowed(PAGES[n], ctx.role)).map((n) => {
    const current = n === active;
    return h('li', h('a', { href: `#/${n}`, 'aria-current': current ? 'page' : false, class: current ? 'active' : '' }, PAGES[n].title));
  });
  const nav = h('nav#nav.nav', { 'aria-label': 'Console' }, h('ul', links));
  const menu = h('button.menu-button', {
    type: 'button', 'aria-controls': 'nav', 'aria-expanded': 'false',
    onclick: () => {
      const open = nav.classList.toggle('open');
      menu.setAttribute('aria-expanded', String(open));
    },
  }, 'Menu');
  nav.addEventListener('click', (e) => {
    if (e.target.closest('a')) { nav.classList.remove('open'); menu.setAttribute('aria-expanded', 'false'); }
  });
  const who = h('div.who',
    h('span.who-email', ctx.me.email),
    h('span.badge.badge-neutral', ctx.role),
    h('button.link-button', { type: 'button', onclick: signOut }, 'Sign out'));
  clear(root,
    h('header.topbar',
      h('a.brand', { href: '#/overview' }, 'aigw', h('span.brand-ws', ctx.workspace.name || '')),
      menu,
      who),
    h('div.layout', nav, h('main#main.main', { tabindex: -1 })));
}

function renderSignIn() {
  document.title = 'Sign in · aigw console';
  const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'username' });
  const password = h('input', { type: 'password', name: 'password', required: true, autocomplete: 'current-password' });
  const form = h('form.form',
    field('Email', email),
    field('Password', password),
    h('div.actions', h('button.primary', { type: 'submit' }, 'Sign in')));
  handleSubmit(form, {
    send: async (fd) => {
      const r = await api.post('/auth/login', { email: fd.get('email').trim(), password: fd.get('password') });
      session.set(r.token);
      ctx = null;
      if (parseHash().name === 'signin' || !location.hash) location.hash = '#/overview';
      else route();
    },
  });
  const sso = h('div.sso');
  clear(root, h('main#main.signin',
    h('div.card',
      h('h1', 'Sign in to aigw'),
      ssoError ? alertBox('error', ssoError) : null,
      sso,
      h('p.muted', 'Use the email and password your workspace owner gave you.'),
      form)));
  ssoError = null;
  email.focus();
  api.get('/auth/methods').then((m) => {
    if (!m || !m.sso) return;
    clear(sso,
      h('a.button.primary', { href: m.sso.start_url }, 'Sign in with SSO'),
      h('p.muted.or', 'or'));
  }).catch(() => { /* an older gateway: passwords only */ });
}

async function signOut() {
  try { await api.post('/auth/logout'); } catch { /* the token may already be invalid */ }
  session.clear();
  ctx = null;
  navigate('#/signin');
}

window.addEventListener('hashchange', route);
setInterval(tickAll, 1000);
route();
