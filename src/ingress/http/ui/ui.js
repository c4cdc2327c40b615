// The operator page's script: polls api/view (relative: the page lives at its login's place,
// /ui/s/PLACE/, and so does everything it asks for) every half second with the last ETag (an
// unchanged list costs a 304), draws the session list and the open panel, and sends cancels
// with the login's CSRF token, as does logging out. The list holds no signals: a waitpoint's
// members and signals are asked for (api/waitpoint) when its part of the panel is opened, and
// again when its row changes while it is open. Every text in the view came from outside
// (labels, intents, messages, member names, sources) and is set with textContent, never parsed
// as HTML.
'use strict';
(function () {
  const POLL_MS = 500;
  const PHONE = window.matchMedia('(max-width: 640px)');
  let etag = null;
  let csrf = null;
  let sessions = [];
  let notShown = { sessions: 0, waitpoints: 0 };
  let openSession = null;
  // Waitpoints whose members and signals are open in the panel, and each one's picture with
  // the row it was asked for (a changed row asks again).
  const openDetails = new Set();
  const pictures = new Map();
  let pending = null;
  // Whether the status line shows a problem with the polling, which the next answer clears.
  let trouble = false;

  const $ = (id) => document.getElementById(id);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function status(text, isTrouble) {
    $('status').textContent = text;
    trouble = Boolean(isTrouble);
  }

  async function poll() {
    try {
      const headers = etag ? { 'If-None-Match': etag } : {};
      const r = await fetch('api/view', { headers, cache: 'no-store' });
      if (r.status === 200 || r.status === 304) {
        if (trouble) status('');
      }
      if (r.status === 200) {
        etag = r.headers.get('ETag');
        const answer = await r.json();
        csrf = answer.csrf;
        sessions = answer.view.sessions;
        notShown = { sessions: answer.view.sessions_not_shown,
            waitpoints: answer.view.waitpoints_not_shown };
        // The daemon builds the list when something changes and at least once a minute; its
        // relative times are as of then.
        $('as-of').textContent = 'Times as of '
            + new Date(answer.view.built_at).toLocaleTimeString() + '.';
        render();
      } else if (r.status === 401) {
        status('Logged out: run `waitpoint ui` and open the address it prints.', true);
      } else if (r.status !== 304) {
        status('The daemon answered ' + r.status + '; retrying.', true);
      }
    } catch (e) {
      status('Cannot reach the daemon; retrying.', true);
    }
    setTimeout(poll, POLL_MS);
  }

  function render() {
    const list = $('sessions');
    list.replaceChildren(...sessions.map(sessionItem));
    $('empty').hidden = sessions.length > 0;
    const more = [];
    if (notShown.sessions > 0) more.push(notShown.sessions + ' more sessions');
    if (notShown.waitpoints > 0) more.push(notShown.waitpoints + ' more waitpoints');
    $('not-shown').textContent = more.length ? 'Not shown: ' + more.join(', ')
        + ' (waitpoint check --session NAME lists them all).' : '';
    $('not-shown').hidden = more.length === 0;
    if (openSession !== null) {
      const s = sessions.find((x) => x.line.session === openSession);
      if (s && s.line.capsule !== '') fillPanel(s);
      else closePanel();
    }
  }

  function sessionItem(s) {
    const line = s.line;
    const li = el('li', 'session');
    li.dataset.session = line.session;
    const ring = el('span', 'ring', line.ring);
    if (line.waiting) ring.title = 'waiting on a machine';
    li.append(ring, el('span', 'name', line.session));
    if (line.unread_wakes > 0) li.append(el('span', 'unread', line.unread_wakes + ' unread'));
    if (line.capsule !== '') {
      const b = el('button', 'capsule' + (line.attention ? ' attention' : ''));
      b.type = 'button';
      b.setAttribute('aria-haspopup', 'dialog');
      const count = line.armed > 0 ? String(line.armed) : line.delivering + ' delivering';
      b.append(el('span', 'full', line.capsule), el('span', 'count', count));
      b.addEventListener('click', () => openPanel(line.session, b));
      li.append(b);
    }
    return li;
  }

  function openPanel(session, anchor) {
    openSession = session;
    const s = sessions.find((x) => x.line.session === session);
    if (!s) return;
    fillPanel(s);
    const panel = $('panel');
    panel.hidden = false;
    place(anchor);
    $('panel-close').focus();
  }

  // A popover below the capsule on a wide screen; on a phone the style sheet makes it a sheet
  // along the bottom, so nothing is placed by hand.
  function place(anchor) {
    const panel = $('panel');
    if (PHONE.matches || !anchor) {
      panel.style.top = '';
      panel.style.left = '';
      return;
    }
    const r = anchor.getBoundingClientRect();
    const left = Math.max(16, Math.min(r.right - panel.offsetWidth,
        innerWidth - panel.offsetWidth - 16));
    panel.style.top = r.bottom + window.scrollY + 8 + 'px';
    panel.style.left = left + window.scrollX + 'px';
  }

  function closePanel() {
    openSession = null;
    $('panel').hidden = true;
  }

  function fillPanel(s) {
    $('panel-title').textContent = s.line.session;
    const body = $('panel-body');
    const sections = s.check.waiting.map((row) => waitpointSection(s.line.session, row));
    if (s.not_shown > 0) {
      sections.push(el('p', 'not-shown', s.not_shown
          + ' more not shown (waitpoint check --session ' + s.line.session + ' lists them all).'));
    }
    body.replaceChildren(...sections);
  }

  function fact(dl, name, value) {
    if (value === undefined || value === null || value === '') return;
    dl.append(el('dt', null, name), el('dd', null, value));
  }

  function waitpointSection(session, row) {
    const sec = el('section', 'wp');
    sec.dataset.id = row.id;
    sec.append(el('h3', null, row.label), el('p', 'intent', row.intent));
    const dl = el('dl', 'facts');
    fact(dl, 'Status', row.status);
    fact(dl, 'Progress', row.progress);
    fact(dl, 'Expires', row.time_left);
    if (row.latest_heartbeat) {
      const h = row.latest_heartbeat;
      const who = h.member ? ' (' + h.member + ')' : '';
      fact(dl, 'Heartbeat', h.age + who + (h.message ? ': ' + h.message : ''));
    }
    if (row.last_report) fact(dl, 'Last report', row.last_report.status + ', '
        + row.last_report.age);
    fact(dl, 'Id', row.id);
    sec.append(dl);
    if (row.badges.length) {
      const badges = el('div', 'badges');
      for (const b of row.badges) {
        const span = el('span', 'badge ' + b.kind, b.text);
        if (b.detail) span.title = b.detail;
        badges.append(span);
      }
      sec.append(badges);
    }
    sec.append(details(row));
    if (row.status === 'armed') {
      const b = el('button', 'cancel', 'Cancel…');
      b.type = 'button';
      b.addEventListener('click', () => askCancel(session, row));
      sec.append(b);
    }
    return sec;
  }

  // Members and signals, asked for when opened: the list carries none.
  function details(row) {
    const d = el('details', 'more');
    d.append(el('summary', null, 'Members and signals'));
    const body = el('div', 'picture');
    d.append(body);
    const key = JSON.stringify(row);
    const show = () => {
      const kept = pictures.get(row.id);
      if (kept && kept.key === key) {
        body.replaceChildren(...pictureParts(kept.picture));
        return;
      }
      body.replaceChildren(el('p', 'meta', 'Loading…'));
      fetchPicture(row.id, key, body);
    };
    d.addEventListener('toggle', () => {
      if (d.open) {
        openDetails.add(row.id);
        show();
      } else {
        openDetails.delete(row.id);
      }
    });
    if (openDetails.has(row.id)) {
      d.open = true;
      show();
    }
    return d;
  }

  async function fetchPicture(id, key, body) {
    try {
      const r = await fetch('api/waitpoint?id=' + encodeURIComponent(id), { cache: 'no-store' });
      if (!r.ok) {
        body.replaceChildren(el('p', 'meta', 'Cannot read it: the daemon answered ' + r.status
            + '.'));
        return;
      }
      const picture = await r.json();
      pictures.set(id, { key, picture });
      if (body.isConnected) body.replaceChildren(...pictureParts(picture));
    } catch (e) {
      body.replaceChildren(el('p', 'meta', 'Cannot reach the daemon.'));
    }
  }

  function pictureParts(picture) {
    const parts = [];
    if (picture.members.length) {
      parts.push(el('p', 'list-title', 'Members'), el('p', 'meta', 'quorum ' + picture.quorum
          + ' of ' + picture.members.length));
      const ul = el('ul', 'members');
      for (const m of picture.members) {
        const last = picture.signals.filter((x) => x.member === m).pop();
        const said = last ? last.status + (last.message ? ' · ' + last.message : '') : null;
        ul.append(el('li', null, m + ': ' + (said ?? 'no report yet')));
      }
      parts.push(ul);
    }
    const older = picture.signals_not_shown > 0 ? ', the newest ' + picture.signals.length
        + ' shown' : '';
    parts.push(el('p', 'list-title', 'Signals (' + picture.counters.signals + older + ')'));
    const ol = el('ol', 'signals');
    for (const x of picture.signals) {
      const by = x.member ? ' · ' + x.member : '';
      const li = el('li', 'signal', x.status + by + (x.message ? ': ' + x.message : ''));
      li.append(el('span', 'meta', x.source + ' · ' + x.received_at));
      ol.append(li);
    }
    parts.push(ol);
    return parts;
  }

  function askCancel(session, row) {
    pending = { id: row.id, session };
    $('confirm-what').textContent = row.label + ' (' + row.id + ')';
    $('confirm').showModal();
  }

  async function cancel() {
    const p = pending;
    pending = null;
    $('confirm').close();
    if (!p) return;
    status('Cancelling…');
    try {
      const r = await fetch('api/cancel', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf },
        body: JSON.stringify({ id: p.id, session: p.session }),
      });
      const answer = await r.text();
      status(r.ok ? 'Cancelled ' + p.id + '; the job itself keeps running.' : 'Not cancelled: '
          + answer);
    } catch (e) {
      status('Not cancelled: cannot reach the daemon.');
    }
    etag = null;
  }

  async function logout() {
    try {
      await fetch('logout', { method: 'POST', headers: { 'X-CSRF-Token': csrf } });
    } catch (e) {
      // Logged out or not, the page leaves: the next visit needs a new address.
    }
    window.location.assign('/ui/login');
  }

  $('logout').addEventListener('click', logout);
  $('confirm-yes').addEventListener('click', cancel);
  $('confirm-no').addEventListener('click', () => {
    pending = null;
    $('confirm').close();
  });
  $('confirm').addEventListener('cancel', () => {
    pending = null;
  });
  $('panel-close').addEventListener('click', closePanel);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && !$('confirm').open) closePanel();
  });
  PHONE.addEventListener('change', () => place(null));
  poll();
})();
