// Browser tests of the web console (issue 8): a real gateway with the mock upstream, Debian's
// chromium driven by playwright-core. Run: `npm ci && npm test` here, after `cargo build`.
// Screenshots go to test-output/console/ (not committed): every page at 390, 1280 and 1920 px
// (`<width>-<page>.png`), and the steps of the scenarios.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import {
  startStack, openPage, signIn, chat, anthropicMessage, mockScript, mockCalls, shot,
  OWNER, ADA, ADA_KEY, OWNER_KEY, FLAKY_KEY, PRIMARY_SECRET,
} from './harness.mjs';

let stack;
const problems = [];
const contexts = [];

async function page(opts = {}) {
  const { context, page: p } = await openPage(stack, { ...opts, problems });
  contexts.push(context);
  p.setDefaultTimeout(15000);
  return p;
}

async function nav(p, name) {
  const menu = p.getByRole('button', { name: 'Menu' });
  if (await menu.isVisible()) await menu.click();
  await p.getByRole('navigation', { name: 'Console' }).getByRole('link', { name, exact: true }).click();
  await p.getByRole('heading', { level: 1, name, exact: true }).waitFor();
}

before(async () => { stack = await startStack(); });

after(async () => {
  for (const c of contexts) await c.close().catch(() => {});
  if (stack) await stack.stop();
});

test('owner: a member guardrail is enforced on the next proxied request and the 429 shows in Logs as Gateway', async () => {
  const p = await page();
  await signIn(p, OWNER);
  await p.getByRole('link', { name: 'Guardrails' }).waitFor();
  await shot(p, 'desktop-overview');

  await nav(p, 'Guardrails');
  await p.getByRole('button', { name: 'New guardrail' }).click();
  const dlg = p.getByRole('dialog', { name: 'New guardrail' });
  // Validation before sending: no subject chosen, no limit.
  await dlg.getByRole('button', { name: 'Create guardrail' }).click();
  await dlg.locator('.field-error').first().waitFor();
  assert.equal(await dlg.getByLabel('Subject', { exact: true }).getAttribute('aria-invalid'), 'true');
  await dlg.getByLabel('Subject kind').selectOption('member');
  await dlg.getByLabel('Subject', { exact: true }).selectOption({ label: ADA.email });
  await dlg.getByLabel('Metric', { exact: true }).selectOption('requests');
  await dlg.getByLabel('Window', { exact: true }).selectOption('day');
  await dlg.getByLabel('Limit', { exact: true }).fill('1');
  await dlg.getByLabel(/Enforce/).check();
  await dlg.getByRole('button', { name: 'Create guardrail' }).click();
  await dlg.waitFor({ state: 'detached' });
  const row = p.getByRole('row').filter({ hasText: ADA.email });
  await row.getByText('1 requests per day').waitFor();
  // The notice covers none of the page's controls (the new row's buttons included).
  await p.locator('#toasts .toast').filter({ hasText: 'Guardrail created.' }).waitFor();
  assert.deepEqual(await p.evaluate(toastCovers), [], 'the toast covers a control');

  // Proxied requests with the member's key until the gateway refuses one.
  const statuses = [];
  let refusal = null;
  for (let i = 0; i < 5 && !refusal; i += 1) {
    const r = await chat(stack, ADA_KEY);
    statuses.push(r.status);
    if (r.status === 429) refusal = r;
  }
  assert.ok(refusal, `no 429 after ${statuses.join(', ')}`);
  assert.equal(refusal.body.error.code, 'quota_exceeded');
  assert.equal(refusal.headers.get('x-aigw-error-source'), 'gateway');
  assert.equal(statuses[0], 200, 'the first request is within the limit');

  // The row shows the usage against the limit.
  await p.reload();
  await p.getByRole('row').filter({ hasText: ADA.email }).getByText('1 / 1').waitFor();
  await shot(p, 'desktop-guardrails');

  // The owner's overview lists the member at their limit, though no quota applies to the owner.
  await nav(p, 'Overview');
  const atLimit = p.locator('.attention-item[data-kind="quota"]').filter({ hasText: `Member ${ADA.email}` });
  await atLimit.getByText('at limit').waitFor();
  assert.match(await atLimit.innerText(), /1 \/ 1 requests used/);
  await shot(p, 'desktop-overview-attention');

  // Logs: filter by source Gateway and status 429 (the log is written behind: wait until it is).
  const ownerToken = await p.evaluate(() => sessionStorage.getItem('aigw.console.token'));
  for (let i = 0; i < 200; i += 1) {
    const res = await fetch(`${stack.base}/admin/v1/logs?status=429&source=gateway`, { headers: { authorization: `Bearer ${ownerToken}` } });
    if ((await res.json()).data.length > 0) break;
    await new Promise((ok) => setTimeout(ok, 50));
  }
  await nav(p, 'Logs');
  await p.getByLabel('Source').selectOption('gateway');
  await p.getByLabel('Status').fill('429');
  await p.getByRole('button', { name: 'Apply filters' }).click();
  const logRow = p.getByRole('row').filter({ hasText: 'quota_exceeded' }).first();
  await logRow.waitFor();
  assert.match(await logRow.innerText(), /429/);
  assert.match(await logRow.innerText(), /Gateway/);
  assert.match(await logRow.innerText(), /ada@acme\.test/);
  await shot(p, 'desktop-logs');
  await logRow.getByRole('button', { name: /Details/ }).click();
  const detail = p.getByRole('dialog', { name: /Request / });
  await detail.getByText('answered by Gateway').waitFor();
  await shot(p, 'desktop-log-detail');
  await detail.getByRole('button', { name: 'Close', exact: true }).first().click();

  // CSV export with the token, downloaded as a file.
  const [download] = await Promise.all([p.waitForEvent('download'), p.getByRole('button', { name: 'Export CSV' }).click()]);
  const csv = await readFile(await download.path(), 'utf8');
  assert.match(csv, /quota_exceeded/);

  // One request found by the x-request-id its client saw; then every failure, and only those.
  const requestId = refusal.headers.get('x-request-id');
  await p.getByLabel('Request ID').fill(`  ${requestId} `);
  await p.getByRole('button', { name: 'Apply filters' }).click();
  await p.waitForFunction((id) => {
    const rows = [...document.querySelectorAll('.log-table tbody tr')];
    return rows.length === 1 && rows[0].querySelector('button').getAttribute('aria-label').endsWith(id);
  }, requestId);
  await p.getByLabel('Request ID').fill('');
  await p.getByLabel('Source').selectOption('');
  await p.getByLabel('Status').fill('');
  await p.getByLabel('Errors only').check();
  await p.getByRole('button', { name: 'Apply filters' }).click();
  await p.waitForFunction(() => {
    const badges = [...document.querySelectorAll('.log-table tbody td.c-status .badge')].map((b) => Number(b.textContent));
    return badges.length > 0 && badges.every((st) => st >= 400);
  });
  await shot(p, 'desktop-logs-errors-only');

  // Loosen the guardrail for the next scenario (edit keeps the usage counter).
  await nav(p, 'Guardrails');
  await p.getByRole('row').filter({ hasText: ADA.email }).getByRole('button', { name: /Edit/ }).click();
  const edit = p.getByRole('dialog', { name: 'Edit guardrail' });
  await edit.getByLabel('Limit', { exact: true }).fill('100');
  await edit.getByRole('button', { name: 'Save' }).click();
  await p.getByRole('row').filter({ hasText: ADA.email }).getByText('100 requests per day').waitFor();

  // A guardrail created after the member's usage counts it, and the confirmation says so.
  await p.getByRole('button', { name: 'New guardrail' }).click();
  const late = p.getByRole('dialog', { name: 'New guardrail' });
  await late.getByLabel('Subject kind').selectOption('member');
  await late.getByLabel('Subject', { exact: true }).selectOption({ label: ADA.email });
  await late.getByLabel('Metric', { exact: true }).selectOption('total_tokens');
  await late.getByLabel('Window', { exact: true }).selectOption('month');
  await late.getByLabel('Limit', { exact: true }).fill('1000000');
  await late.getByLabel(/Shadow/).check();
  await late.getByRole('button', { name: 'Create guardrail' }).click();
  await late.waitFor({ state: 'detached' });
  const counted = p.getByRole('status').filter({ hasText: 'Guardrail created. It counts the' });
  await counted.waitFor();
  assert.match(await counted.innerText(), /counts the [\d,]+ tokens already used since \d{4}-\d\d-01 00:00:00/);
  // Gone again: the next scenarios see the member's one guardrail.
  const mine = (await (await fetch(`${stack.base}/admin/v1/policies`, { headers: { authorization: `Bearer ${ownerToken}` } })).json()).data;
  const extra = mine.find((x) => x.metric === 'total_tokens' && x.window === 'month' && x.subject === 'member');
  const gone = await fetch(`${stack.base}/admin/v1/policies/${extra.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${ownerToken}` } });
  assert.equal(gone.status, 204);
});

test('member: signs in with the keyboard, creates a key shown once, uses it, sees My quota move', async () => {
  const p = await page();
  await p.goto('/console/');
  // A wrong password shows the API's message, not a blank page.
  await p.getByLabel('Email').fill(ADA.email);
  await p.getByLabel('Password').fill('wrong-password');
  await p.getByRole('button', { name: 'Sign in' }).click();
  await p.getByRole('alert').filter({ hasText: /\S/ }).first().waitFor();
  // Keyboard only: the email field has focus; Tab to the password, Enter to send.
  await p.getByLabel('Email').focus();
  await p.keyboard.press('Control+A');
  await p.keyboard.type(ADA.email);
  await p.keyboard.press('Tab');
  await p.keyboard.press('Control+A');
  await p.keyboard.type(ADA.password);
  await p.keyboard.press('Enter');
  await p.getByRole('heading', { name: 'My quota' }).waitFor();

  // A member sees no admin pages.
  const navLinks = await p.getByRole('navigation', { name: 'Console' }).getByRole('link').allInnerTexts();
  for (const hidden of ['Guardrails', 'Upstreams', 'Members', 'Audit log']) assert.ok(!navLinks.includes(hidden), `${hidden} shown to a member`);

  const memberQuota = p.locator('li.quota[data-subject="member"][data-metric="requests"]');
  await memberQuota.waitFor();
  const usedBefore = Number((await memberQuota.locator('.quota-used').innerText()).split('/')[0].replace(/[^\d.]/g, ''));
  await shot(p, 'member-overview');

  await nav(p, 'API keys');
  await p.getByRole('button', { name: 'New API key' }).click();
  const dlg = p.getByRole('dialog', { name: 'New API key' });
  await dlg.getByRole('button', { name: 'Create key' }).click(); // empty name: refused before sending
  await dlg.locator('.field-error').first().waitFor();
  await dlg.getByLabel('Name').fill('laptop');
  await dlg.getByRole('button', { name: 'Create key' }).click();
  const shown = p.getByRole('dialog', { name: 'Your new API key' });
  const keyField = shown.getByLabel('API key');
  const key = await keyField.inputValue();
  assert.match(key, /^sk-aigw-[0-9A-Za-z]{32}$/);
  await shown.getByRole('button', { name: 'Copy' }).click();
  await shown.getByText('Copied to the clipboard.').waitFor();
  assert.equal(await p.evaluate(() => navigator.clipboard.readText()), key);
  await shot(p, 'member-key-shown-once');
  await shown.getByRole('button', { name: 'Done' }).click();
  const keyRow = p.getByRole('row').filter({ hasText: 'laptop' });
  await keyRow.waitFor();
  assert.ok(!(await p.content()).includes(key), 'the plaintext key is not on the page after it was shown');

  // A budget on my own key.
  await keyRow.getByRole('button', { name: /Budget/ }).click();
  const budget = p.getByRole('dialog', { name: /Budget of key laptop/ });
  await budget.getByLabel('Metric', { exact: true }).selectOption('requests');
  await budget.getByLabel('Window', { exact: true }).selectOption('minutes');
  await budget.getByLabel('Minutes per window (N)').fill('7'); // does not divide 1440
  await budget.getByLabel('Limit', { exact: true }).fill('50');
  await budget.getByRole('button', { name: 'Add budget' }).click();
  await budget.getByText(/divides a day/).first().waitFor();
  await budget.getByLabel('Minutes per window (N)').fill('15');
  await budget.getByRole('button', { name: 'Add budget' }).click();
  await budget.waitFor({ state: 'detached' });
  await p.getByRole('row').filter({ hasText: 'laptop' }).getByText('50 requests per 15 minutes').waitFor();

  // A budget the owner puts on my key is shown but offers no Edit or Delete: the API refuses a
  // member's change to a limit set over them, and the dialog says who can change it.
  const json = { 'content-type': 'application/json' };
  const ownerToken = (await (await fetch(`${stack.base}/admin/v1/auth/login`, { method: 'POST', headers: json, body: JSON.stringify(OWNER) })).json()).token;
  const adaToken = await p.evaluate(() => sessionStorage.getItem('aigw.console.token'));
  const myKeys = (await (await fetch(`${stack.base}/admin/v1/keys`, { headers: { authorization: `Bearer ${adaToken}` } })).json()).data;
  const laptop = myKeys.find((k) => k.name === 'laptop');
  const set = await fetch(`${stack.base}/admin/v1/policies`, {
    method: 'POST',
    headers: { ...json, authorization: `Bearer ${ownerToken}` },
    body: JSON.stringify({ subject: 'apikey', target_id: laptop.id, metric: 'total_tokens', window: 'month', limit: 1000000 }),
  });
  assert.equal(set.status, 201, await set.text());
  await nav(p, 'Overview');
  await nav(p, 'API keys');
  await p.getByRole('row').filter({ hasText: 'laptop' }).getByText('1,000,000 total tokens per month').waitFor();
  await p.getByRole('row').filter({ hasText: 'laptop' }).getByRole('button', { name: /Budget/ }).click();
  const budgets = p.getByRole('dialog', { name: /Budget of key laptop/ });
  const ownersBudget = budgets.getByRole('listitem').filter({ hasText: 'total tokens per month' });
  const myBudget = budgets.getByRole('listitem').filter({ hasText: '50 requests per 15 minutes' });
  await ownersBudget.getByText('only an owner or admin can change or delete it').waitFor();
  assert.equal(await ownersBudget.getByRole('button').count(), 0, 'no Edit or Delete on the owner\'s budget');
  assert.equal(await myBudget.getByRole('button', { name: 'Edit' }).count(), 1);
  assert.equal(await myBudget.getByRole('button', { name: 'Delete' }).count(), 1);
  await shot(p, 'member-budget-set-by-owner');
  await budgets.getByText('Close', { exact: true }).click(); // the text button; the × is labelled Close too
  await budgets.waitFor({ state: 'detached' });
  await shot(p, 'member-keys');

  // Request logs are written behind (one flush interval): count mine before, wait for one more.
  const memberToken = await p.evaluate(() => sessionStorage.getItem('aigw.console.token'));
  const myLogs = async () => {
    const res = await fetch(`${stack.base}/admin/v1/logs?limit=500`, { headers: { authorization: `Bearer ${memberToken}` } });
    return (await res.json()).data.length;
  };
  const logsBefore = await myLogs();
  const r = await chat(stack, key);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  for (let i = 0; i < 200 && (await myLogs()) <= logsBefore; i++) await new Promise((ok) => setTimeout(ok, 50));

  await nav(p, 'Overview');
  await p.waitForFunction((before) => {
    const el = document.querySelector('li.quota[data-subject="member"][data-metric="requests"] .quota-used');
    return el && Number(el.textContent.split('/')[0].replace(/[^\d.]/g, '')) > before;
  }, usedBefore, { timeout: 20000 });
  const keyQuota = p.locator('li.quota[data-subject="apikey"]').filter({ hasText: 'laptop' });
  await keyQuota.getByText('1 / 50 requests used').waitFor({ timeout: 20000 });
  await shot(p, 'member-overview-after');

  // Member's own logs show the request.
  await nav(p, 'Logs');
  await p.getByRole('row').filter({ hasText: 'laptop' }).first().waitFor();

  // Sign out revokes the token: the console is back at the sign-in form and the old token fails.
  const token = await p.evaluate(() => sessionStorage.getItem('aigw.console.token'));
  await p.getByRole('button', { name: 'Sign out' }).click();
  await p.getByRole('heading', { name: 'Sign in to aigw' }).waitFor();
  assert.equal(await p.evaluate(() => sessionStorage.getItem('aigw.console.token')), null);
  const me = await fetch(`${stack.base}/admin/v1/me`, { headers: { authorization: `Bearer ${token}` } });
  assert.equal(me.status, 401);
});

test('upstream parked by the mock shows a countdown; Test connection clears it', async () => {
  await mockScript(stack, {
    credential: PRIMARY_SECRET,
    times: 1,
    status: 429,
    headers: { 'retry-after': '120' },
    body: { error: { message: 'Rate limit reached for requests', type: 'requests', code: 'rate_limit_exceeded' } },
  });
  const r = await chat(stack, OWNER_KEY);
  assert.notEqual(r.status, 200, 'the scripted 429 reached the client');

  const p = await page();
  await signIn(p, OWNER);
  await nav(p, 'Upstreams');
  const card = p.locator('article.upstream[data-name="primary"]');
  await card.getByText('parked', { exact: true }).waitFor();
  const countdown = card.locator('.status-parked strong .countdown');
  const first = await countdown.innerText();
  assert.match(first, /^in (1m \d\ds|2m 00s)$/, first);
  // The countdown ticks on its own, without a reload.
  await p.waitForFunction((before) => {
    const el = document.querySelector('article.upstream[data-name="primary"] .status-parked strong .countdown');
    return el && el.textContent !== before;
  }, first, { timeout: 5000 });
  assert.match(await card.innerText(), /provider named when it resets/);
  // The provider's own words, on the card of what they parked; the figures of its last day.
  await card.locator('.said').filter({ hasText: 'Rate limit reached for requests' }).waitFor();
  await card.locator('dl.figures').waitFor();
  assert.match(await card.locator('dl.figures').innerText(), /Attempts[\s\S]*Failed[\s\S]*Parked/);
  await shot(p, 'desktop-upstreams-parked');
  // The request's log tells the attempt in words, with what the provider said.
  await nav(p, 'Logs');
  const failedId = r.headers.get('x-request-id');
  await p.getByLabel('Request ID').fill(failedId);
  const details = p.getByRole('button', { name: `Details of request ${failedId}` });
  for (let i = 0; i < 40 && !(await details.isVisible()); i += 1) {
    await p.getByRole('button', { name: 'Apply filters' }).click();
    await new Promise((ok) => setTimeout(ok, 250));
  }
  await details.click();
  const detail = p.getByRole('dialog', { name: /Request / });
  const attempt = detail.locator('li.attempt').first();
  await attempt.locator('.said').filter({ hasText: 'Provider said: Rate limit reached for requests' }).waitFor();
  assert.match(await attempt.innerText(), /HTTP 429[\s\S]*primary[\s\S]*parked until/);
  await shot(p, 'desktop-log-detail-attempts');
  await detail.getByRole('button', { name: 'Close', exact: true }).last().click();
  await nav(p, 'Overview');
  const parked = p.locator('.attention-item[data-kind="credential"]').filter({ hasText: 'Credential primary' });
  await parked.getByText('parked', { exact: true }).waitFor();
  assert.match(await parked.innerText(), /resumes in \d/);
  await nav(p, 'Upstreams');

  await card.getByRole('button', { name: /Test connection/ }).click();
  await card.getByText(/Connection OK .*Locks cleared/).waitFor();
  await p.locator('article.upstream[data-name="primary"]').getByText('ready', { exact: true }).waitFor();
  assert.equal(await p.locator('article.upstream[data-name="primary"] .status-parked').count(), 0);
  await shot(p, 'desktop-upstreams');

  const calls = await mockCalls(stack);
  assert.ok(calls.calls.some((c) => c.credential === PRIMARY_SECRET && c.status === 200), 'the test reached the mock');
  // Traffic flows again.
  assert.equal((await chat(stack, OWNER_KEY)).status, 200);
});

test('a key whose requests keep failing trips its breaker: Keys shows it blocked with a countdown and the trip', async () => {
  // 100 failing requests within 60 s (an unknown model) trip the key: blocked for 30 s.
  const statuses = [];
  for (let i = 0; i < 10; i += 1) {
    const batch = await Promise.all(Array.from({ length: 10 }, () => chat(stack, FLAKY_KEY, 'no-such-model')));
    statuses.push(...batch.map((r) => r.status));
  }
  assert.ok(statuses.every((st) => st >= 400), `statuses: ${[...new Set(statuses)]}`);
  const blocked = await chat(stack, FLAKY_KEY);
  assert.equal(blocked.status, 429);
  assert.equal(blocked.body.error.code, 'api_key_circuit_open');

  const p = await page();
  await signIn(p, OWNER);
  await nav(p, 'API keys');
  const row = p.getByRole('row').filter({ hasText: 'flaky' });
  await row.getByText('blocked', { exact: true }).waitFor();
  assert.match(await row.locator('.countdown').innerText(), /^in \d+s$/);
  assert.match(await row.innerText(), /1 trip\b/);
  assert.ok(await row.getByRole('button', { name: /Delete key flaky/ }).isVisible());
  await shot(p, 'desktop-keys-breaker');
  await row.getByRole('button', { name: /Breaker history/ }).click();
  const dlg = p.getByRole('dialog', { name: 'Breaker of key flaky' });
  await dlg.getByRole('row').filter({ hasText: '100 / 100' }).waitFor();
  await dlg.getByRole('button', { name: 'Close', exact: true }).last().click();
  await nav(p, 'Overview');
  await p.locator('.attention-item[data-kind="breaker"]').filter({ hasText: 'Key owner@acme.test/flaky' }).getByText('blocked', { exact: true }).waitFor();
});

test('owner: invites a member (one-time password), sees API errors as messages, edits an upstream without seeing its secret', async () => {
  const p = await page();
  await signIn(p, OWNER);

  // The Invite button shows before the page's lists have loaded: a slow department list must
  // still be offered in full to a quick click.
  await p.route((url) => url.pathname.endsWith('/departments'), async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 500));
    await route.continue();
  });
  await nav(p, 'Members');
  await p.getByRole('button', { name: 'Invite member' }).click();
  const invite = p.getByRole('dialog', { name: 'Invite a member' });
  await invite.getByLabel('Email').fill('not-an-email');
  await invite.getByRole('button', { name: 'Invite' }).click();
  await invite.locator('.field-error').first().waitFor(); // refused before sending
  await invite.getByLabel('Email').fill('grace@acme.test');
  await invite.getByLabel('Department').selectOption({ label: 'research' });
  await invite.getByRole('button', { name: 'Invite' }).click();
  const otp = p.getByRole('dialog', { name: 'Member invited' });
  assert.ok((await otp.getByLabel('One-time password').inputValue()).length >= 8);
  await otp.getByRole('button', { name: 'Done' }).click();
  await p.getByRole('row').filter({ hasText: 'grace@acme.test' }).waitFor();

  // Ada is declared in the resources file: her row says so, and changing her role asks first
  // (the next start would undo it); cancelling changes nothing.
  const ada = p.getByRole('row').filter({ hasText: ADA.email });
  await ada.getByText('resources file').waitFor();
  assert.equal(await p.getByRole('row').filter({ hasText: 'grace@acme.test' }).getByText('resources file').count(), 0);
  await ada.getByLabel(`Role of ${ADA.email}`).selectOption('admin');
  const ask = p.getByRole('dialog', { name: 'Managed by the resources file' });
  assert.match(await ask.innerText(), /undone at the next start/);
  await ask.getByRole('button', { name: 'Cancel' }).click();
  await ask.waitFor({ state: 'detached' });
  // The list is drawn again from the API: her role is still member.
  await p.waitForFunction((email) => {
    const sel = document.querySelector(`select[aria-label="Role of ${email}"]`);
    return sel && sel.value === 'member';
  }, ADA.email);

  // A conflict from the API is shown with the API's own message.
  await nav(p, 'Models');
  await p.getByRole('button', { name: 'New model' }).click();
  const model = p.getByRole('dialog', { name: 'New model' });
  await model.getByLabel('Name').fill('fast');
  await model.getByRole('button', { name: 'Create model' }).click();
  const err = model.locator('.form-error, .field-error').filter({ hasText: /\S/ }).first();
  await err.waitFor();
  assert.doesNotMatch(await err.innerText(), /^\s*$/);
  await model.getByRole('button', { name: 'Cancel' }).click();

  // The secret field is write-only: empty when editing, and saving without it keeps the secret.
  await nav(p, 'Upstreams');
  const card = p.locator('article.upstream[data-name="claude"]');
  await card.getByRole('button', { name: /Edit/ }).click();
  const edit = p.getByRole('dialog', { name: 'Edit claude' });
  // Declared in the resources file: marked on its card, and the edit dialog warns.
  await card.getByText('resources file').waitFor();
  assert.match(await edit.locator('.alert-warn').innerText(), /undone at the next start/);
  assert.equal(await edit.getByLabel('API key (secret)').inputValue(), '');
  assert.equal(await edit.getByLabel('API key (secret)').getAttribute('type'), 'password');
  await edit.getByLabel('Requests per day').fill('500');
  await edit.getByRole('button', { name: 'Save' }).click();
  await edit.waitFor({ state: 'detached' });
  await p.locator('article.upstream[data-name="claude"]').getByText('500 req/day').waitFor();
  const after = await anthropicMessage(stack, OWNER_KEY);
  assert.equal(after.status, 200, `the secret was kept: ${JSON.stringify(after.body)}`);
  const calls = await mockCalls(stack);
  assert.equal(calls.calls.filter((c) => c.path.endsWith('/messages')).at(-1).credential, 'cred-claude');
});

test('owner: a Bedrock upstream takes AWS keys instead of an API key, and never shows the secret', async () => {
  const p = await page();
  await signIn(p, OWNER);
  await nav(p, 'Upstreams');
  await p.getByRole('button', { name: 'New upstream' }).click();
  const dlg = p.getByRole('dialog', { name: 'New upstream credential' });
  // The AWS fields show only for provider bedrock, and then the API key field hides.
  assert.equal(await dlg.getByLabel('AWS region').isVisible(), false);
  await dlg.getByLabel('Provider').selectOption('bedrock');
  assert.equal(await dlg.getByLabel('API key (secret)').isVisible(), false);
  await dlg.getByLabel('Name').fill('bedrock-west');
  await dlg.getByLabel('AWS region').fill('us-west-2');
  await dlg.getByLabel('Access key id').fill('AKIACONSOLE000000001');
  await dlg.getByLabel('Secret access key (secret)').fill('console/Secret+Key');
  assert.equal(await dlg.getByLabel('Secret access key (secret)').getAttribute('type'), 'password');
  await dlg.getByLabel('Models').fill('claude-west=anthropic.claude-3-5-sonnet-20240620-v1:0');
  await shot(p, 'desktop-upstreams-new-bedrock');
  await dlg.getByRole('button', { name: 'Create upstream' }).click();
  await dlg.waitFor({ state: 'detached' });
  const card = p.locator('article.upstream[data-name="bedrock-west"]');
  await card.getByText('AWS Bedrock', { exact: false }).first().waitFor();
  // Editing shows the region and key id, never the secret key.
  await card.getByRole('button', { name: /Edit/ }).click();
  const edit = p.getByRole('dialog', { name: 'Edit bedrock-west' });
  assert.equal(await edit.getByLabel('AWS region').inputValue(), 'us-west-2');
  assert.equal(await edit.getByLabel('Access key id').inputValue(), 'AKIACONSOLE000000001');
  assert.equal(await edit.getByLabel('Secret access key (secret)').inputValue(), '');
  assert.doesNotMatch(await p.content(), /console\/Secret\+Key/);
  await edit.getByRole('button', { name: 'Cancel' }).click();
});

test('owner: a service token made in Settings is shown once, works as a bearer, and Revoke stops it', async () => {
  const p = await page();
  await signIn(p, OWNER);
  await nav(p, 'Settings');
  await p.getByRole('button', { name: 'New service token' }).click();
  const dlg = p.getByRole('dialog', { name: 'New service token' });
  await dlg.getByRole('button', { name: 'Create token' }).click(); // no name: refused before sending
  await dlg.locator('.field-error').first().waitFor();
  await dlg.getByLabel('Name').fill('terraform');
  await dlg.getByLabel('Role').selectOption('admin');
  await dlg.getByRole('button', { name: 'Create token' }).click();
  const shown = p.getByRole('dialog', { name: 'Your new service token' });
  const token = await shown.getByLabel('Service token').inputValue();
  assert.match(token, /^aigw_st_[0-9A-Za-z]{43}$/);
  await shot(p, 'owner-token-shown-once');
  await shown.getByRole('button', { name: 'Done' }).click();
  const row = p.getByRole('table', { name: 'Service tokens' }).getByRole('row').filter({ hasText: 'terraform' });
  await row.getByText('active', { exact: true }).waitFor();
  assert.match(await row.innerText(), new RegExp(token.slice(0, 12)));
  assert.ok(!(await p.content()).includes(token), 'the secret is not on the page after it was shown');

  // A script: the token as a bearer, acting as an admin.
  const asScript = (path) => fetch(`${stack.base}/admin/v1${path}`, { headers: { authorization: `Bearer ${token}` } });
  const me = await asScript('/me');
  assert.equal(me.status, 200);
  assert.equal((await me.json()).role, 'admin');
  assert.equal((await asScript('/members')).status, 200);

  await row.getByRole('button', { name: 'Revoke token terraform' }).click();
  await p.getByRole('dialog', { name: 'Revoke service token' }).getByRole('button', { name: 'Revoke' }).click();
  await row.getByText('revoked', { exact: true }).waitFor();
  await shot(p, 'owner-token-revoked');
  assert.equal((await asScript('/me')).status, 401);
});

const PAGES = [
  ['overview', 'Overview'], ['guardrails', 'Guardrails'], ['alerts', 'Alerts'], ['keys', 'API keys'], ['upstreams', 'Upstreams'],
  ['models', 'Models'], ['logs', 'Logs'], ['usage', 'Usage'], ['members', 'Members'], ['audit', 'Audit log'], ['settings', 'Settings'],
];
const WIDTHS = [[390, 844], [1280, 800], [1920, 1080]];

/**
 * What sticks out sideways or is cut, measured in the page: the document wider than the window,
 * any element of the main content (or of an open dialog) whose content is wider than its box (a
 * table behind a horizontal scroll, a clipped button), chart text outside its drawing, a select
 * too narrow for its chosen option, a date broken over lines, a usage bar squeezed under 80 px,
 * and a filter whose input sits higher or lower than the others of its row. There is no
 * deliberately scrollable region left in the console, so none is excused.
 */
function overflowIn() {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) out.push(`the page is ${doc.scrollWidth - doc.clientWidth} px wider than the window`);
  const describe = (el) => {
    const cls = typeof el.className === 'string' && el.className ? `.${el.className.trim().split(/\s+/).join('.')}` : '';
    const text = (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 40);
    return `<${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''}${cls}> "${text}"`;
  };
  const root = document.querySelector('dialog[open]') || document.getElementById('main');
  const all = [root, ...root.querySelectorAll('*')];
  // Content clipped on purpose to be read by screen readers only (a phone table's header row).
  const hidden = all.filter((el) => getComputedStyle(el).clip !== 'auto');
  for (const el of all) {
    if (el.closest('svg') || hidden.some((c) => c.contains(el)) || el.matches('input, select, textarea, option')) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'inline' || cs.display === 'none' || el.clientWidth <= 1) continue;
    if (el.scrollWidth > el.clientWidth + 1) out.push(`${describe(el)} is ${el.scrollWidth - el.clientWidth} px wider than its box`);
  }
  // A select shows its chosen option whole (the arrow takes about 24 px of its inner width).
  const ctx2d = document.createElement('canvas').getContext('2d');
  for (const sel of root.querySelectorAll('select')) {
    if (!sel.offsetParent || sel.selectedIndex < 0) continue;
    const cs = getComputedStyle(sel);
    ctx2d.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const text = sel.options[sel.selectedIndex].text;
    const room = sel.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 20;
    const need = ctx2d.measureText(text).width;
    if (need > room + 1) out.push(`${describe(sel)} [${sel.getAttribute('aria-label') || sel.name}] cuts "${text}" (${Math.round(need)} px in ${Math.round(room)} px)`);
  }
  // A date or time on one line.
  const dates = /\b\d{2}-\d{2} \d{2}:\d{2}|\d{4}-\d{2}-\d{2}/;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!dates.test(n.textContent) || !n.parentElement || !n.parentElement.offsetParent || n.parentElement.closest('pre, details:not([open])')) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
    if (lines.size > 1) out.push(`the date "${n.textContent.trim()}" is broken over ${lines.size} lines`);
  }
  for (const b of root.querySelectorAll('.bar')) {
    if (b.offsetParent && b.getBoundingClientRect().width < 79.5) out.push(`${describe(b.closest('td, li') || b)}: a usage bar only ${Math.round(b.getBoundingClientRect().width)} px wide`);
  }
  // The inputs of a row of filters line up, whatever hint is under one of them.
  for (const form of root.querySelectorAll('.filters')) {
    // Fields that share a band of height share a row of the grid.
    const rows = [];
    const fields = [...form.querySelectorAll(':scope > .field, :scope > .custom-range > .field')]
      .map((f) => [f.getBoundingClientRect(), f.querySelector('input:not([type=checkbox]), select')])
      .filter(([, ctl]) => ctl && ctl.offsetParent)
      .sort(([a], [b]) => a.top - b.top);
    for (const [r, ctl] of fields) {
      const row = rows.find((x) => r.top < x.bottom - 1);
      if (row) { row.ctls.push(ctl); row.bottom = Math.max(row.bottom, r.bottom); } else rows.push({ bottom: r.bottom, ctls: [ctl] });
    }
    for (const { ctls } of rows) {
      const tops = ctls.map((c) => Math.round(c.getBoundingClientRect().top));
      if (Math.max(...tops) - Math.min(...tops) > 2) out.push(`filters: the inputs of one row are ${Math.max(...tops) - Math.min(...tops)} px apart (${ctls.map((c) => c.name).join(', ')})`);
    }
  }
  for (const svg of root.querySelectorAll('svg.chart')) {
    const vb = svg.viewBox.baseVal;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBBox();
      if (b.x < vb.x - 0.5 || b.x + b.width > vb.x + vb.width + 0.5) out.push(`chart text "${t.textContent}" is cut off (x ${Math.round(b.x)}..${Math.round(b.x + b.width)} of ${vb.width})`);
    }
  }
  return out;
}

/** What a shown toast lies over: the page's content (where the buttons of a new row may be at
 * any moment), and any of its buttons, links and fields. */
function toastCovers() {
  const toasts = [...document.querySelectorAll('#toasts .toast')].map((t) => t.getBoundingClientRect());
  const out = [];
  const main = document.getElementById('main').getBoundingClientRect();
  const visible = { left: main.left, right: main.right, top: Math.max(main.top, 0), bottom: Math.min(main.bottom, window.innerHeight) };
  for (const t of toasts) {
    if (visible.left < t.right && t.left < visible.right && visible.top < t.bottom && t.top < visible.bottom) out.push('the page\'s content');
  }
  for (const el of document.querySelectorAll('#main button, #main a, #main input, #main select, #main textarea')) {
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height) continue;
    for (const t of toasts) {
      if (r.left < t.right && t.left < r.right && r.top < t.bottom && t.top < r.bottom) out.push(`${el.tagName.toLowerCase()} "${(el.innerText || el.getAttribute('aria-label') || el.name || '').trim().slice(0, 30)}"`);
    }
  }
  return out;
}

async function settle(p) {
  await p.locator('#main p.loading').first().waitFor({ state: 'detached' }).catch(() => {});
}

test('owner: limits a key and a member to some models and a number in flight; the proxy refuses the rest', async () => {
  const p = await page();
  await signIn(p, OWNER);
  const json = { 'content-type': 'application/json' };
  const ownerToken = await p.evaluate(() => sessionStorage.getItem('aigw.console.token'));
  const asOwner = (path, init = {}) => fetch(`${stack.base}/admin/v1${path}`, { ...init, headers: { ...json, authorization: `Bearer ${ownerToken}` } });

  // A new key with an allow-list and a cap, from the create form; a bad pattern is refused there.
  await nav(p, 'API keys');
  await p.getByRole('button', { name: 'New API key' }).click();
  const dlg = p.getByRole('dialog', { name: 'New API key' });
  await dlg.getByLabel('Name').fill('limited');
  await dlg.getByLabel('Allowed models').fill('gpt-*-mini');
  await dlg.getByRole('button', { name: 'Create key' }).click();
  await dlg.locator('.field-error').filter({ hasText: 'may only end a pattern' }).waitFor();
  assert.equal(await dlg.getByLabel('Allowed models').getAttribute('aria-invalid'), 'true');
  await dlg.getByLabel('Allowed models').fill('gpt-4o*, fast');
  await dlg.getByLabel('Max in flight').fill('2');
  await dlg.getByRole('button', { name: 'Create key' }).click();
  const shown = p.getByRole('dialog', { name: 'Your new API key' });
  const key = await shown.getByLabel('API key').inputValue();
  await shown.getByRole('button', { name: 'Done' }).click();
  const row = p.getByRole('row').filter({ hasText: 'limited' });
  await row.getByText('gpt-4o*, fast').waitFor();
  await row.getByText('≤ 2 in flight').waitFor();
  await shot(p, 'owner-key-limits');

  const allowed = await chat(stack, key, 'gpt-4o-mini');
  assert.equal(allowed.status, 200, JSON.stringify(allowed.body));
  const refused = await chat(stack, key, 'claude-sonnet');
  assert.equal(refused.status, 403, JSON.stringify(refused.body));
  assert.equal(refused.body.error.code, 'model_not_allowed');
  assert.equal(refused.body.error.param, 'model');
  assert.equal(refused.body.error.model, 'claude-sonnet');
  const models = await (await fetch(`${stack.base}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).json();
  assert.ok(models.data.length > 0);
  assert.deepEqual(models.data.map((m) => m.id).filter((id) => !id.startsWith('gpt-4o') && id !== 'fast'), [], 'only allowed models listed');

  // Edited from the row: another list, no cap.
  await row.getByRole('button', { name: 'Limits of key limited' }).click();
  const edit = p.getByRole('dialog', { name: 'Limits of key limited' });
  assert.equal(await edit.getByLabel('Allowed models').inputValue(), 'gpt-4o*, fast');
  assert.equal(await edit.getByLabel('Max in flight').inputValue(), '2');
  await edit.getByLabel('Allowed models').fill('claude-*');
  await edit.getByLabel('Max in flight').fill('');
  await edit.getByRole('button', { name: 'Save limits' }).click();
  await edit.waitFor({ state: 'detached' });
  await row.getByText('claude-*').waitFor();
  await row.getByText('no cap').waitFor();
  const now = await chat(stack, key, 'gpt-4o-mini');
  assert.equal(now.status, 403, 'the new list applies to the next request');
  const keys = (await (await asOwner('/keys')).json()).data;
  const limited = keys.find((k) => k.name === 'limited');
  assert.deepEqual([limited.allowed_models, limited.max_in_flight], [['claude-*'], null]);

  // A member invited with limits, then changed from the Members page; their keys follow them.
  await nav(p, 'Members');
  await p.getByRole('button', { name: 'Invite member' }).click();
  const invite = p.getByRole('dialog', { name: 'Invite a member' });
  await invite.getByLabel('Email').fill('lin@acme.test');
  await invite.getByLabel('Allowed models').fill('gpt-4o-mini');
  await invite.getByLabel('Max in flight').fill('0');
  await invite.getByRole('button', { name: 'Invite' }).click();
  await invite.locator('.field-error').first().waitFor(); // refused before sending
  assert.equal(await invite.getByLabel('Max in flight').getAttribute('aria-invalid'), 'true');
  await invite.getByLabel('Max in flight').fill('3');
  await invite.getByRole('button', { name: 'Invite' }).click();
  const otp = p.getByRole('dialog', { name: 'Member invited' });
  await otp.getByRole('button', { name: 'Done' }).click();
  const linRow = p.getByRole('row').filter({ hasText: 'lin@acme.test' });
  await linRow.getByText('≤ 3 in flight').waitFor();
  await linRow.getByRole('button', { name: 'Limits of lin@acme.test' }).click();
  const memberEdit = p.getByRole('dialog', { name: 'Limits of lin@acme.test' });
  await memberEdit.getByLabel('Max in flight').fill('5');
  await memberEdit.getByRole('button', { name: 'Save limits' }).click();
  await memberEdit.waitFor({ state: 'detached' });
  await linRow.getByText('≤ 5 in flight').waitFor();
  await shot(p, 'owner-member-limits');
  const lin = (await (await asOwner('/members')).json()).data.find((m) => m.email === 'lin@acme.test');
  assert.deepEqual([lin.allowed_models, lin.max_in_flight], [['gpt-4o-mini'], 5]);
  const made = await asOwner('/keys', { method: 'POST', body: JSON.stringify({ name: 'lin-app', member_id: lin.id }) });
  assert.equal(made.status, 201);
  const linKey = (await made.json()).key;
  const byMember = await chat(stack, linKey, 'claude-sonnet');
  assert.equal(byMember.status, 403);
  assert.equal(byMember.body.error.subject, 'member');
  assert.equal((await chat(stack, linKey, 'gpt-4o-mini')).status, 200);
});

test('owner: a key expiring within 7 days is marked; Rotate shows the new secret once and the old one stops', async () => {
  const p = await page();
  await signIn(p, OWNER);
  await nav(p, 'API keys');
  await p.getByRole('button', { name: 'New API key' }).click();
  const dlg = p.getByRole('dialog', { name: 'New API key' });
  await dlg.getByLabel('Name').fill('short-lived');
  const local = (ms) => new Date(ms - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 16);
  await dlg.getByLabel('Expires at').fill(local(Date.now() - 3600e3));
  await dlg.getByRole('button', { name: 'Create key' }).click();
  await dlg.locator('.field-error').filter({ hasText: 'in the future' }).waitFor(); // refused before sending
  await dlg.getByLabel('Expires at').fill(local(Date.now() + 3 * 86400e3));
  await dlg.getByRole('button', { name: 'Create key' }).click();
  const shown = p.getByRole('dialog', { name: 'Your new API key' });
  const oldKey = await shown.getByLabel('API key').inputValue();
  await shown.getByRole('button', { name: 'Done' }).click();
  const row = p.getByRole('row').filter({ hasText: 'short-lived' });
  await row.getByText('expires soon').waitFor();
  assert.equal((await chat(stack, oldKey)).status, 200);

  await row.getByRole('button', { name: 'Rotate key short-lived' }).click();
  const rotate = p.getByRole('dialog', { name: 'Rotate key short-lived' });
  assert.equal(await rotate.getByLabel('Old secret keeps working').inputValue(), '86400', 'a day by default');
  await rotate.getByLabel('Old secret keeps working').selectOption('0');
  await rotate.getByRole('button', { name: 'Rotate key' }).click();
  const fresh = p.getByRole('dialog', { name: 'New secret of key short-lived' });
  const newKey = await fresh.getByLabel('API key').inputValue();
  assert.match(newKey, /^sk-aigw-[0-9A-Za-z]{32}$/);
  assert.notEqual(newKey, oldKey);
  await shot(p, 'owner-key-rotated');
  await fresh.getByRole('button', { name: 'Done' }).click();
  await row.getByText(newKey.slice(0, 12)).waitFor(); // the new prefix
  assert.ok(!(await p.content()).includes(newKey), 'the new secret is not on the page after it was shown');
  assert.equal((await chat(stack, newKey)).status, 200, 'the new secret works at once');
  const old = await chat(stack, oldKey);
  assert.equal(old.status, 401);
  assert.equal(old.body.error.code, 'invalid_api_key', 'no grace: the old secret stopped');
  await row.getByText('expires soon').waitFor(); // rotation keeps the expiry

  // Expired from the row: the proxy says so with its own code; cleared again.
  await row.getByRole('button', { name: 'Expiry of key short-lived' }).click();
  const expiry = p.getByRole('dialog', { name: 'Expiry of key short-lived' });
  await expiry.getByLabel('Expires at').fill(local(Date.now() - 60e3));
  await expiry.getByRole('button', { name: 'Save expiry' }).click();
  await row.getByText('expired', { exact: true }).waitFor();
  const expired = await chat(stack, newKey);
  assert.equal(expired.status, 401);
  assert.equal(expired.body.error.code, 'api_key_expired');
  await row.getByRole('button', { name: 'Expiry of key short-lived' }).click();
  await expiry.getByLabel('Expires at').fill('');
  await expiry.getByRole('button', { name: 'Save expiry' }).click();
  await row.locator('td.c-expires').getByText('never').waitFor();
  assert.equal((await chat(stack, newKey)).status, 200);
  // Left expiring, so the page checks below see a date and its mark in the row.
  await row.getByRole('button', { name: 'Expiry of key short-lived' }).click();
  await expiry.getByLabel('Expires at').fill(local(Date.now() + 5 * 86400e3));
  await expiry.getByRole('button', { name: 'Save expiry' }).click();
  await row.getByText('expires soon').waitFor();
});

test('owner: a guardrail with budget alerts; the webhook gets a signed alert, Alerts shows its delivery, Send now delivers it', async () => {
  // A webhook receiver that answers 500 until told otherwise.
  const got = [];
  let answer = 500;
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => { raw += c; });
    req.on('end', () => { got.push({ headers: req.headers, raw, body: JSON.parse(raw) }); res.writeHead(answer); res.end(); });
  });
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  const hook = `http://127.0.0.1:${server.address().port}/hook`;
  const secret = 'console-signing-secret-01';
  try {
    const p = await page();
    await signIn(p, OWNER);
    await nav(p, 'Guardrails');
    await p.getByRole('button', { name: 'New guardrail' }).click();
    const dlg = p.getByRole('dialog', { name: 'New guardrail' });
    await dlg.getByLabel('Subject kind').selectOption('apikey');
    await dlg.getByLabel('Subject', { exact: true }).selectOption({ label: `${OWNER.email}/ops` });
    await dlg.getByLabel('Metric', { exact: true }).selectOption('requests');
    await dlg.getByLabel('Window', { exact: true }).selectOption('day');
    await dlg.getByLabel('Limit', { exact: true }).fill('100');
    // The console checks the thresholds; the gateway checks the secret (its 422 lands by the field).
    await dlg.getByLabel('Alert at (% of the limit)').fill('0');
    await dlg.getByLabel('Webhook URL').fill(hook);
    await dlg.getByRole('button', { name: 'Create guardrail' }).click();
    await dlg.locator('.field-error').filter({ hasText: 'from 1 to 1000' }).waitFor();
    await dlg.getByLabel('Alert at (% of the limit)').fill('1, 100');
    await dlg.getByLabel('Signing secret').fill('too-short');
    await dlg.getByRole('button', { name: 'Create guardrail' }).click();
    await dlg.locator('.field-error').filter({ hasText: '16 to 512' }).waitFor();
    await shot(p, 'desktop-guardrail-alerts');
    await dlg.getByLabel('Signing secret').fill(secret);
    await dlg.getByRole('button', { name: 'Create guardrail' }).click();
    await dlg.waitFor({ state: 'detached' });
    const row = p.getByRole('row').filter({ hasText: `${OWNER.email}/ops` });
    await row.getByText('1 %, 100 %').waitFor();

    // One request is 1 % of 100: the gateway fires after its next flush and sends at once.
    assert.equal((await chat(stack, OWNER_KEY)).status, 200);
    for (let i = 0; i < 100 && got.length === 0; i += 1) await new Promise((ok) => setTimeout(ok, 100));
    assert.ok(got.length >= 1, 'the receiver got the alert');
    const first = got[0];
    assert.equal(first.body.subject.name, `${OWNER.email}/ops`);
    assert.equal(first.body.threshold, 1);
    assert.equal(first.body.workspace, 'acme');
    const [, t, v1] = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(first.headers['x-aigw-signature']);
    assert.equal(createHmac('sha256', secret).update(`${t}.${first.raw}`).digest('hex'), v1);

    // The Alerts page: retrying after the 500, with the receiver's answer.
    await nav(p, 'Alerts');
    const alertRow = p.getByRole('row').filter({ hasText: `${OWNER.email}/ops` });
    await alertRow.getByText('retrying').waitFor();
    await alertRow.getByText(/HTTP 500/).first().waitFor();
    await shot(p, 'desktop-alerts-retrying');
    answer = 200;
    // The gateway's own retry may come first; either way it ends delivered.
    await alertRow.getByRole('button', { name: /Send the 1 % alert now/ }).click({ timeout: 3000 }).catch(() => {});
    await alertRow.getByText('delivered', { exact: true }).waitFor({ timeout: 20000 });
    assert.ok(got.every((g) => g.body.id === first.body.id), 'one alert, tried until delivered');
    await shot(p, 'desktop-alerts-delivered');
  } finally {
    server.close();
  }
});

test('owner: a key limited to some tags, a guardrail on a tag value, logs and usage by tag', async () => {
  const p = await page();
  await signIn(p, OWNER);
  const tagged = async (key, tags, endUser) => {
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-aigw-tags': tags };
    if (endUser) headers['x-aigw-end-user'] = endUser;
    const r = await fetch(`${stack.base}/v1/chat/completions`, {
      method: 'POST', headers, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    });
    return { status: r.status, body: await r.json().catch(() => null) };
  };

  // A key that may send team=search and any feature; a malformed entry is refused in the form.
  await nav(p, 'API keys');
  await p.getByRole('button', { name: 'New API key' }).click();
  const dlg = p.getByRole('dialog', { name: 'New API key' });
  await dlg.getByLabel('Name').fill('tagged');
  await dlg.getByLabel('Allowed tags').fill('Team=search');
  await dlg.getByRole('button', { name: 'Create key' }).click();
  await dlg.locator('.field-error').filter({ hasText: 'key=value' }).waitFor();
  await dlg.getByLabel('Allowed tags').fill('team=search, feature=*');
  await dlg.getByRole('button', { name: 'Create key' }).click();
  const shown = p.getByRole('dialog', { name: 'Your new API key' });
  const key = await shown.getByLabel('API key').inputValue();
  await shown.getByRole('button', { name: 'Done' }).click();
  await p.getByRole('row').filter({ hasText: 'tagged' }).getByText('tags: team=search, feature=*').waitFor();

  const refused = await tagged(key, 'team=ads');
  assert.equal(refused.status, 403, JSON.stringify(refused.body));
  assert.deepEqual([refused.body.error.code, refused.body.error.tag], ['tag_not_allowed', 'team=ads']);
  assert.equal((await tagged(key, 'team=search,feature=summaries', 'alice')).status, 200);

  // A guardrail of one request a day on team=search: the next such request is refused.
  await nav(p, 'Guardrails');
  await p.getByRole('button', { name: 'New guardrail' }).click();
  const g = p.getByRole('dialog', { name: 'New guardrail' });
  await g.getByLabel('Subject kind').selectOption('tag');
  await g.getByLabel('Tag', { exact: true }).fill('team=search');
  await g.getByRole('spinbutton', { name: 'Limit' }).fill('1');
  await g.getByRole('button', { name: 'Create guardrail' }).click();
  await g.waitFor({ state: 'detached' });
  await p.getByRole('row').filter({ hasText: 'team=search' }).waitFor();
  await shot(p, 'owner-tag-guardrail');
  // Counted from the guardrail on (as every quota): one more request, then the refusal.
  assert.equal((await tagged(key, 'team=search', 'bob')).status, 200);
  const over = await tagged(key, 'team=search', 'bob');
  assert.equal(over.status, 429, JSON.stringify(over.body));
  assert.deepEqual([over.body.error.subject, over.body.error.tag], ['tag', 'team=search']);

  // Logs filtered by the tag and by the end user show both columns.
  await nav(p, 'Logs');
  await p.getByLabel('Tag', { exact: true }).fill('team=search');
  const logs = p.getByRole('table', { name: 'Request logs' });
  // The log writer flushes every 250 ms: the last request's row may come a moment later.
  for (let i = 0; i < 40; i += 1) {
    await p.getByRole('button', { name: 'Apply filters' }).click();
    if (await logs.getByText('429').isVisible().catch(() => false)) break;
    await new Promise((ok) => setTimeout(ok, 250));
  }
  await logs.getByText('429').waitFor();
  assert.equal(await logs.locator('tbody tr').count(), 3);
  await p.getByLabel('End user').fill('alice');
  await p.getByRole('button', { name: 'Apply filters' }).click();
  // The table before the filter also holds alice's row: wait for the filtered one to replace it.
  for (let i = 0; i < 40 && (await logs.locator('tbody tr').count()) !== 1; i += 1) {
    await new Promise((ok) => setTimeout(ok, 250));
  }
  await logs.locator('tbody tr').filter({ hasText: 'alice' }).waitFor();
  assert.equal(await logs.locator('tbody tr').count(), 1);
  await shot(p, 'owner-logs-by-tag');

  // Usage per value of a tag key.
  await nav(p, 'Usage');
  await p.getByLabel('By tag').fill('team');
  await p.getByLabel('By tag').press('Enter');
  const section = p.locator('section').filter({ has: p.getByRole('heading', { name: 'By tag team' }) });
  await section.getByText('search').first().waitFor();
  await shot(p, 'owner-usage-by-tag');
});

test('owner: Settings lists the end users and tag values requests brought; Prune deletes one', async () => {
  const p = await page();
  await signIn(p, OWNER);
  const bring = async (headers) => {
    const r = await fetch(`${stack.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADA_KEY}`, 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(r.status, 200, await r.text());
  };
  await bring({ 'x-aigw-end-user': 'erin' });
  await bring({ 'x-aigw-end-user': 'frank', 'x-aigw-tags': 'project=apollo' });

  await nav(p, 'Settings');
  const card = p.locator('section').filter({ has: p.getByRole('heading', { name: 'Tags and end users' }) });
  const labels = card.getByRole('table', { name: 'Labels' });
  await labels.getByRole('row').filter({ hasText: 'frank' }).waitFor();
  await card.getByText(/end users; at most/).waitFor();
  await shot(p, 'owner-labels');
  await card.getByRole('button', { name: 'Prune frank' }).click();
  await p.getByRole('dialog', { name: 'Prune labels' }).getByRole('button', { name: 'Prune', exact: true }).click();
  await p.locator('#toasts .toast').filter({ hasText: '1 pruned.' }).waitFor();
  await labels.getByText('frank', { exact: true }).waitFor({ state: 'detached' });
  await labels.getByText('erin', { exact: true }).waitFor();
  await card.getByLabel('Show').selectOption('tag');
  await labels.getByText('project=apollo', { exact: true }).waitFor();
  await card.getByRole('button', { name: 'Prune project=apollo' }).waitFor();
});

test('every page at 390, 1280 and 1920 px: screenshots, and nothing wider than its box', async () => {
  // A key blocked by its breaker (its second trip: 2 minutes), so Keys shows the longest state.
  for (let i = 0; i < 10; i += 1) await Promise.all(Array.from({ length: 10 }, () => chat(stack, FLAKY_KEY, 'no-such-model')));
  assert.equal((await chat(stack, FLAKY_KEY)).body.error.code, 'api_key_circuit_open');
  const failures = [];
  for (const [width, height] of WIDTHS) {
    const p = await page({ width, height });
    await signIn(p, OWNER);
    for (const [slug, title] of PAGES) {
      await nav(p, title);
      await settle(p);
      if (slug === 'usage') {
        await p.locator('svg.chart rect.col').first().waitFor({ state: 'attached' });
        // By model lists real models; requests for none or for one that does not exist are one row.
        const byModel = p.locator('section.chart-card').filter({ has: p.getByRole('heading', { name: 'By model' }) });
        const labels = await byModel.locator('.hbar-label').allInnerTexts();
        assert.ok(labels.includes('gpt-4o-mini') && labels.includes('Unknown or no model'), labels.join(', '));
        assert.ok(!labels.includes('no-such-model') && !labels.includes('—'), labels.join(', '));
      }
      if (slug === 'logs' && width >= 1280) {
        // Tokens, credits and latency are columns at 1280 px too, and the explanation has room.
        for (const label of ['Tokens / credits', 'Latency']) {
          assert.ok(await p.getByRole('columnheader', { name: label }).isVisible(), `${label} at ${width} px`);
        }
        const expl = await p.getByRole('columnheader', { name: 'Explanation' }).evaluate((th) => th.getBoundingClientRect().width);
        assert.ok(expl >= (width >= 1920 ? 500 : 250), `the explanation is ${Math.round(expl)} px wide at ${width} px`);
      }
      if (slug === 'logs' && width < 500) {
        // A log row is a short card on a phone, not a column of twelve labelled lines.
        const heights = await p.locator('.log-table tbody tr').evaluateAll((rows) => rows.map((r) => r.getBoundingClientRect().height));
        assert.ok(heights.length > 0 && Math.max(...heights) < 180, `log cards up to ${Math.max(...heights)} px tall`);
      }
      const errors = await p.locator('#main .alert-error').allInnerTexts();
      assert.deepEqual(errors, [], `${title} shows an error at ${width} px`);
      await shot(p, `${width}-${slug}`);
      for (const o of await p.evaluate(overflowIn)) failures.push(`${title} at ${width} px: ${o}`);
    }
    // The dialog with the most fields.
    await nav(p, 'Upstreams');
    await p.getByRole('button', { name: 'New upstream' }).click();
    const dlg = p.getByRole('dialog', { name: 'New upstream credential' });
    await dlg.waitFor();
    await shot(p, `${width}-upstreams-new`);
    for (const o of await p.evaluate(overflowIn)) failures.push(`New upstream dialog at ${width} px: ${o}`);
    await dlg.getByRole('button', { name: 'Cancel' }).click();
  }
  assert.deepEqual(failures, []);
});

test('single sign-on: the identity provider signs a member in, with the role of their group', async () => {
  // The provider's development pages link a web font: refused, so nothing leaves this machine,
  // and left out of the page's problems (they are the provider's, not the console's).
  const own = [];
  const { context, page: p } = await openPage(stack, { problems: own, also: [stack.idp] });
  contexts.push(context);
  p.setDefaultTimeout(15000);
  await p.route(/^https?:\/\/(?!127\.0\.0\.1)/, (r) => r.abort());
  await p.goto('/console/');
  await p.getByRole('link', { name: 'Sign in with SSO' }).click();
  // The provider's own sign-in and consent pages.
  await p.locator('input[name="login"]').fill('sam@acme.test');
  await p.locator('input[name="password"]').fill('any');
  await p.getByRole('button', { name: 'Sign-in' }).click();
  await p.getByRole('button', { name: 'Continue' }).click();
  // Back in the console, signed in as a new admin; the token is not left in the address.
  await p.getByRole('heading', { name: 'My quota' }).waitFor();
  await p.locator('.who-email', { hasText: 'sam@acme.test' }).waitFor();
  assert.equal(await p.locator('.who .badge').innerText(), 'admin');
  assert.ok(!p.url().includes('sso_token'), p.url());
  await shot(p, 'sso-signed-in');

  await p.getByRole('button', { name: 'Sign out' }).click();
  await p.getByRole('link', { name: 'Sign in with SSO' }).waitFor();

  // Someone in no mapped group (a fresh browser: no session at the provider) is told why, on
  // the sign-in page.
  const second = await openPage(stack, { problems: own, also: [stack.idp] });
  contexts.push(second.context);
  const q = second.page;
  q.setDefaultTimeout(15000);
  await q.route(/^https?:\/\/(?!127\.0\.0\.1)/, (r) => r.abort());
  await q.goto('/console/');
  await q.getByRole('link', { name: 'Sign in with SSO' }).click();
  await q.locator('input[name="login"]').fill('nobody@acme.test');
  await q.locator('input[name="password"]').fill('any');
  await q.getByRole('button', { name: 'Sign-in' }).click();
  await q.getByRole('button', { name: 'Continue' }).click();
  await q.getByText('in no group that gives access').waitFor();
  assert.ok(q.url().endsWith('#/signin'), q.url());
  await shot(q, 'sso-no-access');
  const font = /fonts\.googleapis\.com|net::ERR_FAILED/;
  assert.deepEqual(own.filter((x) => !font.test(x)), []);
});

test('no request left for another host and no page error', () => {
  assert.deepEqual(problems, []);
});
