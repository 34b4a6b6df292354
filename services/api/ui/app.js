// Sluice's web UI: a page per route (#/graph, #/asset/KEY, #/dep/ID, #/runs,
// #/run/KEY, #/notifications), every answer from sluice-api's own routes, kept live by its
// event stream. No build step and nothing from a CDN: this file, app.css and
// index.html are compiled into sluice-api (docs/decisions/0005-web-ui.md).

const main = document.getElementById('main');
const ROLES = ['viewer', 'editor', 'operator', 'admin'];
let token = sessionStorage.getItem('sluice.token');
let me = null;

// ---- small helpers -------------------------------------------------------

/** An element; text children are text nodes, so nothing is ever parsed as HTML. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const svg = (tag, attrs = {}) => {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
};
const pill = (s) => h('span', { class: `pill s-${String(s).toLowerCase()}` }, s);
const when = (ms) => (ms ? new Date(ms).toISOString().replace('T', ' ').replace('Z', '') : '—');
const enc = encodeURIComponent;

function toast(text, bad = false) {
  const t = document.getElementById('toast');
  t.textContent = text;
  t.className = bad ? 'bad' : '';
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 6000);
}

class Refused extends Error {}

/** One call to the API; a refusal throws with the API's own message. */
async function api(method, path, body) {
  const r = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  let v;
  try { v = JSON.parse(text); } catch { v = text; }
  if (r.status === 401) { signOut(); throw new Refused('sign in again'); }
  if (!r.ok) throw new Refused(`${r.status}: ${v?.error?.message ?? text}`);
  return v;
}

/** Whether the signed-in principal holds at least `role` in `project`. */
function may(role, project) {
  if (!me) return false;
  const rank = (r) => ROLES.indexOf(r);
  const held = [me.roles?.[project], me.roles?.['*']].filter(Boolean).map(rank);
  return held.length > 0 && Math.max(...held) >= rank(role);
}

/** A button for an action that needs `role` in `project`: disabled, saying why, without it. */
function action(label, role, project, run) {
  const allowed = may(role, project);
  return h('button', {
    class: 'primary', 'data-action': label.toLowerCase().replace(/ /g, '-'),
    disabled: !allowed, title: allowed ? '' : `needs ${role} in ${project}`,
    onclick: async () => {
      try { toast(await run()); refresh(); } catch (e) { toast(e.message, true); }
    },
  }, label);
}

// ---- sign-in and the event stream ----------------------------------------

function signOut() {
  sessionStorage.removeItem('sluice.token');
  token = null; me = null;
  document.getElementById('who').textContent = '';
  document.getElementById('signout').hidden = true;
  location.hash = '#/signin';
}
document.getElementById('signout').onclick = signOut;

function signInPage() {
  const input = h('input', { id: 'token', type: 'password', placeholder: 'API token or identity-provider JWT', autocomplete: 'off' });
  const go = async () => {
    token = input.value.trim();
    try {
      me = await api('GET', '/v1/whoami');
      sessionStorage.setItem('sluice.token', token);
      started();
      location.hash = '#/graph';
    } catch (e) { token = null; toast(e.message, true); }
  };
  input.addEventListener('keydown', (e) => e.key === 'Enter' && go());
  return h('div', { class: 'card signin' }, h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'Your token is kept in this tab only.'), input,
    h('button', { class: 'primary', id: 'signin', onclick: go }, 'Sign in'));
}

let stream = null;
/** Follows GET /v1/events (fetch, so the token goes in a header) and refreshes the
 *  page on what it shows; reconnects after a drop. */
async function follow() {
  const live = document.getElementById('live');
  while (token) {
    const ctl = new AbortController();
    stream = ctl;
    try {
      const r = await fetch('/v1/events', { headers: { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' }, signal: ctl.signal });
      if (!r.ok) throw new Error(`events: ${r.status}`);
      live.textContent = '● live'; live.className = 'live on';
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          if (block.split('\n').some((l) => l.startsWith('data:'))) refreshSoon();
        }
      }
    } catch (e) { if (e.name === 'AbortError') return; }
    live.textContent = '○ reconnecting'; live.className = 'live';
    await new Promise((r) => setTimeout(r, 1000));
  }
}

let soon = null;
function refreshSoon() {
  if (soon) return;
  soon = setTimeout(() => { soon = null; refresh(); }, 250);
}

function started() {
  document.getElementById('who').textContent = `${me.name} · ${Object.entries(me.roles).map(([p, r]) => `${p}:${r}`).join(' ')}`;
  document.getElementById('signout').hidden = false;
  if (!stream) follow();
}

// ---- pages ---------------------------------------------------------------

const COLOURS = ['fresh', 'waiting', 'pending', 'stale', 'failed', 'running', 'paused', 'refused', 'unknown'];
let graphView = null; // the graph's viewBox, kept across live redraws

async function graphPage(params) {
  const filter = params.get('filter') ?? '';
  const project = params.get('project') ?? '';
  const q = new URLSearchParams({ layout: 'layered' });
  if (filter) q.set('filter', filter);
  if (project) q.set('project', project);
  const g = await api('GET', `/v1/lineage?${q}`);
  const box = h('input', { id: 'filter', placeholder: 'filter: asset key or dependency id', value: filter, size: 34 });
  const proj = h('input', { id: 'project', placeholder: 'project', value: project, size: 10 });
  const apply = () => { graphView = null; location.hash = `#/graph?${new URLSearchParams({ filter: box.value, project: proj.value })}`; };
  box.addEventListener('keydown', (e) => e.key === 'Enter' && apply());
  proj.addEventListener('keydown', (e) => e.key === 'Enter' && apply());
  const assets = g.nodes.filter((n) => n.kind === 'asset').length;
  const deps = g.nodes.length - assets;
  const bar = h('div', { class: 'toolbar' }, box, proj, h('button', { onclick: apply }, 'Filter'),
    h('span', { class: 'muted', id: 'counts' }, `${assets} assets · ${deps} dependencies`),
    h('span', { class: 'legend' }, COLOURS.map((c) => pill(c))));
  const canvas = svg('svg', { id: 'graph' });
  const W = 220, H = 34;
  const at = new Map(g.nodes.map((n) => [`${n.kind}:${n.id}`, n]));
  const edges = svg('g');
  for (const e of g.edges) {
    const [from, to] = e.kind === 'reads' ? [`asset:${e.from}`, `dependency:${e.to}`] : [`dependency:${e.from}`, `asset:${e.to}`];
    const a = at.get(from), b = at.get(to);
    if (!a || !b) continue;
    const x1 = a.x + W / 2, x2 = b.x - W / 2, mx = (x1 + x2) / 2;
    edges.append(svg('path', { class: 'edge', d: `M${x1},${a.y} C${mx},${a.y} ${mx},${b.y} ${x2},${b.y}` }));
  }
  const nodes = svg('g');
  for (const n of g.nodes) {
    const node = svg('g', { class: `node ${n.kind === 'asset' ? 'asset' : 'dep'} st-${n.state}`, 'data-id': n.id, 'data-kind': n.kind, 'data-state': n.state, transform: `translate(${n.x - W / 2},${n.y - H / 2})` });
    node.append(svg('rect', { width: W, height: H }));
    const label = svg('text', { x: 10, y: 21 });
    label.textContent = (n.kind === 'asset' ? '▭ ' : '⚙ ') + (n.id.length > 30 ? `${n.id.slice(0, 29)}…` : n.id);
    node.append(label);
    const title = svg('title');
    title.textContent = `${n.kind} ${n.id}: ${n.state}`;
    node.append(title);
    node.addEventListener('click', () => { location.hash = n.kind === 'asset' ? `#/asset/${enc(n.id)}` : `#/dep/${enc(n.id)}`; });
    nodes.append(node);
  }
  canvas.append(edges, nodes);
  // Pan with a drag, zoom with the wheel: only the viewBox moves.
  graphView = graphView ?? { x: 0, y: 0, w: Math.max(g.width, 900), h: Math.max(Math.min(g.height, 1400), 500) };
  const show = () => canvas.setAttribute('viewBox', `${graphView.x} ${graphView.y} ${graphView.w} ${graphView.h}`);
  show();
  let drag = null;
  canvas.addEventListener('pointerdown', (e) => { drag = { x: e.clientX, y: e.clientY, v: { ...graphView } }; });
  window.addEventListener('pointerup', () => (drag = null));
  canvas.addEventListener('pointermove', (e) => {
    if (!drag) return;
    const k = graphView.w / canvas.clientWidth;
    graphView.x = drag.v.x - (e.clientX - drag.x) * k;
    graphView.y = drag.v.y - (e.clientY - drag.y) * k;
    show();
  });
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const f = e.deltaY > 0 ? 1.15 : 1 / 1.15;
    graphView.x += (graphView.w * (1 - f)) / 2; graphView.y += (graphView.h * (1 - f)) / 2;
    graphView.w *= f; graphView.h *= f;
    show();
  }, { passive: false });
  return [h('h1', {}, 'Asset graph'), bar, canvas];
}

function fields(obj, keys) {
  return h('dl', {}, keys.flatMap(([label, v]) => [h('dt', {}, label), h('dd', {}, v ?? '—')]).filter(Boolean));
}

async function assetPage(key) {
  const [a, commits, uses] = await Promise.all([
    api('GET', `/v1/assets/${enc(key)}`),
    api('GET', `/v1/assets/${enc(key)}/commits?limit=20`).catch((e) => ({ error: e.message })),
    api('GET', `/v1/assets/${enc(key)}/dependencies`),
  ]);
  // What each reader waits for: the evaluator's own summary (the first 20 readers).
  const readers = await Promise.all((uses.read_by ?? []).slice(0, 20).map((id) =>
    api('GET', `/v1/dependencies/${enc(id)}/explain`).then((e) => [id, e.summary]).catch((e) => [id, e.message])));
  const l = a.latest ?? {};
  const rows = (commits.items ?? []).map((c) => h('tr', {},
    h('td', {}, c.sequence), h('td', { class: 'mono' }, c.snapshot_id), h('td', {}, c.operation), h('td', {}, c.source),
    h('td', {}, when(c.commit_time_ms)), h('td', {}, (c.partitions ?? []).join(', '))));
  const link = (id) => h('a', { href: `#/dep/${enc(id)}` }, id);
  return [
    h('h1', {}, key),
    h('div', { class: 'card' }, fields(a, [
      ['format', a.format], ['snapshot', l.snapshot_id], ['sequence', l.sequence], ['committed', when(l.commit_time_ms)],
      ['operation', l.operation], ['watermark', when(a.watermark_ms)], ['schema', a.schema ? `${a.schema[1]} (since sequence ${a.schema[0]})` : null],
      ['quality', a.quality ? a.quality.status : null], ['commits', `${a.commit_count} (${a.data_commit_count} data)`],
      ['partitions', (l.partitions ?? []).join(', ')],
    ])),
    h('h2', {}, 'Read by'), h('div', { id: 'readers' }, readers.map(([id, summary]) => h('div', {}, link(id), ' — ', h('span', { class: 'reason' }, summary ?? '')))),
    h('h2', {}, 'Produced by'), h('div', {}, (uses.produced_by ?? []).map((id) => h('div', {}, link(id)))),
    h('h2', {}, 'Recent commits'),
    commits.error ? h('p', { class: 'muted' }, commits.error)
      : h('table', {}, h('tr', {}, ['sequence', 'snapshot', 'operation', 'source', 'committed', 'partitions'].map((c) => h('th', {}, c))), rows),
  ];
}

/** The explain tree: every leaf satisfied or not, with its reason; a shut
 *  `schema_unchanged` leaf offers the schema acknowledgement (`ack`). */
function tree(n, ack) {
  const ok = n.satisfied ? 'ok' : 'no';
  if (n.node === 'all' || n.node === 'any') {
    return h('li', { class: ok }, `${n.node} of`, h('ul', { class: 'tree' }, (n.children ?? []).map((c) => tree(c, ack))));
  }
  return h('li', { class: ok, 'data-asset': n.asset }, h('a', { href: `#/asset/${enc(n.asset)}` }, n.asset),
    h('ul', { class: 'tree' }, (n.checks ?? []).map((c) => h('li', { class: `leaf ${c.satisfied ? 'ok' : 'no'}`, 'data-predicate': c.predicate },
      h('b', {}, c.predicate), ': ', h('span', { class: 'reason' }, c.reason ?? ''),
      !c.satisfied && c.predicate === 'schema_unchanged' ? [' ', ack(n.asset)] : null))));
}

/** A backfill's progress as one line. */
function progress(b) {
  const p = b.progress ?? {};
  return `${p.succeeded ?? 0}/${p.total ?? b.items_total} succeeded · ${p.running ?? 0} running · ${p.failed ?? 0} failed · ${p.pending ?? 0} pending · ${p.cancelled ?? 0} cancelled`;
}

async function depPage(id) {
  const [d, e, runs, backfills] = await Promise.all([
    api('GET', `/v1/dependencies/${enc(id)}`),
    api('GET', `/v1/dependencies/${enc(id)}/explain`),
    api('GET', `/v1/runs?dependency=${enc(id)}&limit=20`),
    api('GET', `/v1/backfills?dependency=${enc(id)}&limit=10`),
  ]);
  const project = d.owner_project;
  const reason = h('input', { id: 'reason', placeholder: 'reason (recorded with the action)', size: 40 });
  const say = () => ({ reason: reason.value || undefined });
  const timer = e.timers?.fire_at_ms ? h('p', {}, `fires at ${when(e.timers.fire_at_ms)} (in ${Math.max(0, e.timers.fire_at_ms - Date.now())} ms)`) : null;
  const ack = (asset) => action('Accept the new schema', 'operator', project, async () => {
    const v = await api('POST', `/v1/dependencies/${enc(id)}/acknowledge-schema`, { input: asset, reason: reason.value || 'accepted in the web UI' });
    return v.changed === false ? 'nothing was shut' : `${asset}'s schema accepted for ${id}`;
  });
  const parts = h('input', { id: 'backfill-partitions', placeholder: 'partitions: dt=2026-11-01,dt=2026-11-02', size: 40 });
  const from = h('input', { id: 'backfill-from', placeholder: 'or from dt=2026-11-01', size: 18 });
  const to = h('input', { id: 'backfill-to', placeholder: 'to dt=2026-11-30', size: 18 });
  const backfill = action('Backfill', 'operator', project, async () => {
    const range = parts.value.trim()
      ? { partitions: parts.value.split(',').map((x) => x.trim()).filter(Boolean) }
      : { partition_range: { from: from.value.trim(), to: to.value.trim() } };
    const v = await api('POST', `/v1/dependencies/${enc(id)}/backfills`, { ...range, ...say() });
    return `backfill ${v.backfill_id}: ${v.items} items${v.resubmitted ? ' (resubmitted: nothing new)' : ''}`;
  });
  const backfillRows = (backfills.items ?? []).map((b) => h('tr', { 'data-backfill': b.backfill_id },
    h('td', { class: 'mono' }, b.backfill_id), h('td', {}, pill(b.state)), h('td', { class: 'progress' }, progress(b)),
    h('td', {}, b.requested_by), h('td', {}, b.state === 'running'
      ? action('Cancel', 'operator', project, async () => { await api('POST', `/v1/backfills/${enc(b.backfill_id)}/cancel`, say()); return `${b.backfill_id} cancelled`; })
      : '')));
  const runRows = (runs.items ?? []).map((r) => h('tr', {},
    h('td', { class: 'mono' }, h('a', { href: `#/run/${r.trigger_key}` }, r.trigger_key)), h('td', {}, pill(r.status ?? 'PENDING')), h('td', {}, r.origin), h('td', {}, r.attempt),
    h('td', {}, `${r.target_kind}/${r.target_name}`, r.external_id ? h('div', { class: 'muted mono' }, r.external_id) : ''),
    h('td', {}, when(r.requested_ms)), h('td', { class: 'reason' }, r.status_reason ?? r.reason)));
  return [
    h('h1', {}, id, ' ', pill(d.paused ? 'paused' : e.status === 'satisfied' || e.status === 'triggered' ? 'fresh' : e.status ?? d.status)),
    h('div', { class: 'toolbar' }, reason,
      d.paused
        ? action('Resume', 'operator', project, async () => { await api('POST', `/v1/dependencies/${enc(id)}/resume`, say()); return `${id} resumed`; })
        : action('Pause', 'operator', project, async () => { await api('POST', `/v1/dependencies/${enc(id)}/pause`, say()); return `${id} paused`; }),
      action('Run now', 'operator', project, async () => {
        const v = await api('POST', `/v1/dependencies/${enc(id)}/runs`, { request_id: crypto.randomUUID(), ...say() });
        return `run ${v.trigger_key} requested`;
      }),
      h('span', { class: 'muted' }, `project ${project} · version ${d.version}`)),
    h('div', { class: 'card', id: 'explain' }, h('b', {}, e.summary ?? ''), timer,
      h('ul', { class: 'tree' }, tree(e.condition, ack)),
      e.last_trigger_key ? h('p', { class: 'muted' }, `last trigger ${e.last_trigger_key}`) : null),
    h('h2', {}, 'Runs'),
    h('table', { id: 'runs' }, h('tr', {}, ['trigger key', 'status', 'origin', 'attempt', 'target', 'requested', 'reason'].map((c) => h('th', {}, c))), runRows),
    h('h2', {}, 'Backfills'),
    h('div', { class: 'toolbar' }, parts, from, to, backfill),
    h('table', { id: 'backfills' }, h('tr', {}, ['backfill', 'state', 'progress', 'by', ''].map((c) => h('th', {}, c))), backfillRows),
    h('h2', {}, 'Spec'), h('pre', { class: 'card mono' }, JSON.stringify(d.spec, null, 2)),
  ];
}

async function runPage(key) {
  const r = await api('GET', `/v1/runs/${enc(key)}`);
  const inputs = (r.inputs ?? []).map((i) => h('tr', {},
    h('td', {}, h('a', { href: `#/asset/${enc(i.asset)}` }, i.asset)), h('td', { class: 'mono' }, i.snapshot_id), h('td', {}, i.sequence), h('td', {}, when(i.watermark_ms))));
  const steps = (r.transitions ?? []).map((t) => h('tr', {},
    h('td', {}, when(t.at_ms)), h('td', {}, pill(t.status)), h('td', {}, t.attempt), h('td', {}, t.revision),
    h('td', { class: 'mono' }, t.invocation_id ?? ''), h('td', { class: 'mono' }, t.external_id ?? ''), h('td', { class: 'reason' }, t.reason ?? '')));
  return [
    h('h1', {}, 'Run ', h('span', { class: 'mono' }, key), ' ', pill(r.status ?? 'PENDING')),
    h('div', { class: 'card' }, fields(r, [
      ['dependency', h('a', { href: `#/dep/${enc(r.dependency_id)}` }, r.dependency_id)], ['version', r.dependency_version],
      ['origin', `${r.origin}${r.requested_by ? ` by ${r.requested_by}` : ''}`], ['re-run of', r.rerun_of ? h('a', { href: `#/run/${r.rerun_of}` }, r.rerun_of) : null],
      ['target', `${r.target_kind?.toLowerCase()}/${r.target_name}`],
      ['at the target', r.target_url ? h('a', { href: r.target_url, target: '_blank', rel: 'noopener', id: 'target-link' }, r.external_id) : r.external_id],
      ['partition', r.partition], ['reason', r.reason], ['requested', when(r.requested_ms)], ['first commit', when(r.first_commit_ms)],
    ])),
    h('h2', {}, 'Snapshot combination'),
    h('table', { id: 'inputs' }, h('tr', {}, ['input', 'snapshot', 'sequence', 'watermark'].map((c) => h('th', {}, c))), inputs),
    h('h2', {}, 'Transitions'),
    h('table', { id: 'transitions' }, h('tr', {}, ['at', 'status', 'attempt', 'revision', 'invocation', 'external id', 'reason'].map((c) => h('th', {}, c))), steps),
  ];
}

async function runsPage(params) {
  const want = Object.fromEntries(['status', 'target', 'dependency', 'project', 'since'].map((k) => [k, params.get(k) ?? '']));
  const q = new URLSearchParams({ limit: '500' });
  for (const k of ['status', 'target', 'dependency']) if (want[k]) q.set(k, want[k]);
  const [runs, deps] = await Promise.all([api('GET', `/v1/runs?${q}`), api('GET', '/v1/dependencies?limit=1000')]);
  const owner = new Map((deps.items ?? []).map((d) => [d.id, d.owner_project]));
  const since = want.since ? Date.now() - Number(want.since) * 3600_000 : 0;
  const items = (runs.items ?? []).filter((r) => (!want.project || owner.get(r.dependency_id) === want.project)
    && (!since || (r.requested_ms ?? 0) >= since));
  const go = () => { location.hash = `#/runs?${new URLSearchParams(Object.fromEntries(Object.entries(inputs).map(([k, el]) => [k, el.value])))}`; };
  const pick = h('select', { id: 'status', onchange: go },
    ['', 'UNKNOWN', 'FAILED', 'RUNNING', 'PENDING', 'SUCCEEDED', 'CANCELLED'].map((s) => h('option', { value: s, selected: s === want.status }, s || 'any status')));
  const inputs = { status: pick };
  for (const [k, hint] of [['target', 'target name'], ['dependency', 'dependency'], ['project', 'project'], ['since', 'last N hours']]) {
    inputs[k] = h('input', { id: `runs-${k}`, placeholder: hint, value: want[k], size: 12 });
    inputs[k].addEventListener('keydown', (e) => e.key === 'Enter' && go());
  }
  const project = (r) => owner.get(r.dependency_id) ?? '*';
  const rows = items.map((r) => h('tr', {},
    h('td', { class: 'mono' }, h('a', { href: `#/run/${r.trigger_key}` }, r.trigger_key)), h('td', {}, h('a', { href: `#/dep/${enc(r.dependency_id)}` }, r.dependency_id)),
    h('td', {}, pill(r.status ?? 'PENDING')), h('td', {}, `${r.target_kind}/${r.target_name}`), h('td', {}, when(r.requested_ms)),
    h('td', {}, r.status === 'UNKNOWN'
      ? ['succeeded', 'failed', 'retry'].map((o) => action(`Settle ${o}`, 'operator', project(r), async () => {
        const why = prompt(`What did you check at the target? (settle ${o})`);
        if (!why) throw new Refused('a reason is required');
        await api('POST', `/v1/runs/${enc(r.trigger_key)}/settle`, { outcome: o, reason: why });
        return `${r.trigger_key} settled: ${o}`;
      }))
      : ['FAILED', 'SUCCEEDED', 'CANCELLED'].includes(r.status)
        ? action('Re-run', 'operator', project(r), async () => {
          const v = await api('POST', `/v1/runs/${enc(r.trigger_key)}/rerun`, { request_id: crypto.randomUUID() });
          return `re-run ${v.trigger_key} requested`;
        })
        : '')));
  return [h('h1', {}, 'Runs'), h('div', { class: 'toolbar' }, Object.values(inputs), h('button', { onclick: go }, 'Filter'),
    h('span', { class: 'muted' }, 'UNKNOWN first: they wait for a person')),
    h('table', {}, h('tr', {}, ['trigger key', 'dependency', 'status', 'target', 'requested', ''].map((c) => h('th', {}, c))), rows)];
}

async function notificationsPage() {
  const [rules, sent] = await Promise.all([api('GET', '/v1/notifications'), api('GET', '/v1/notification-deliveries?limit=100')]);
  return [h('h1', {}, 'Notifications'),
    h('table', {}, h('tr', {}, ['rule', 'project', 'on', 'format'].map((c) => h('th', {}, c))),
      (rules.items ?? []).map((r) => h('tr', {}, h('td', {}, r.id), h('td', {}, r.document?.project), h('td', {}, (r.document?.on ?? []).join(', ')), h('td', {}, r.document?.webhook?.format ?? 'json')))),
    h('h2', {}, 'Sent and waiting'),
    h('table', {}, h('tr', {}, ['key', 'status', 'attempts', 'last error'].map((c) => h('th', {}, c))),
      (sent.items ?? []).map((d) => h('tr', {}, h('td', { class: 'mono' }, d.delivery_key), h('td', {}, pill(d.status)), h('td', {}, d.attempts), h('td', { class: 'reason' }, d.last_error ?? ''))))];
}

// ---- the router -------------------------------------------------------------

async function refresh() {
  const [path, query] = location.hash.slice(1).split('?');
  const params = new URLSearchParams(query ?? '');
  const parts = (path || '/graph').split('/').filter(Boolean);
  if (!token) { main.replaceChildren(signInPage()); return; }
  if (!me) {
    try { me = await api('GET', '/v1/whoami'); started(); } catch (e) { main.replaceChildren(signInPage()); return; }
  }
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === parts[0]);
  try {
    let page;
    switch (parts[0]) {
      case 'asset': page = await assetPage(decodeURIComponent(parts.slice(1).join('/'))); break;
      case 'dep': page = await depPage(decodeURIComponent(parts.slice(1).join('/'))); break;
      case 'runs': page = await runsPage(params); break;
      case 'run': page = await runPage(decodeURIComponent(parts[1] ?? '')); break;
      case 'notifications': page = await notificationsPage(); break;
      case 'signin': page = signInPage(); break;
      default: page = await graphPage(params);
    }
    // A live redraw keeps what the user was typing and where — read now, after
    // the page's requests, not before them: what was typed while they were under
    // way would be lost (a backfill's partitions, typed as a run status arrived).
    const focused = document.activeElement?.id;
    const typed = [...main.querySelectorAll('input[id]')].map((i) => [i.id, i.value]);
    main.replaceChildren(...[page].flat());
    main.dataset.page = parts[0] ?? 'graph';
    main.dataset.loaded = String(Date.now());
    for (const [id, value] of typed) {
      const el = document.getElementById(id);
      if (el && !el.value) el.value = value;
    }
    if (focused) document.getElementById(focused)?.focus();
  } catch (e) {
    main.replaceChildren(h('div', { class: 'card' }, h('b', {}, 'Could not load this page: '), e.message));
  }
}

window.addEventListener('hashchange', refresh);
refresh();
