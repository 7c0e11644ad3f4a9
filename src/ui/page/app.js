// The console page: draws what the console's GET routes return, with text nodes only (never
// markup from a document), and asks `api/changes` again and again so updates arrive without a
// reload. It has no way to change anything: every request it makes is a GET.
"use strict";

const state = { version: null, picked: null, receipt: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function get(path) {
  const res = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!res.ok) throw new Error(res.status + " " + (await res.text()));
  return res.json();
}

async function drawFleet() {
  const doc = await get("api/fleet");
  const list = document.getElementById("boxes");
  list.replaceChildren(...doc.boxes.map((b) =>
    el("li", {
      class: b.signal.colour + (b.name === state.picked ? " picked" : ""),
      "data-box": b.name,
      onclick: () => pick(b.name),
    },
    el("span", { class: "name" }, b.name),
    el("span", { class: "meta" }, b.tier + " \u00b7 " + b.state),
    el("span", { class: "signal" }, b.signal.text))));
  if (doc.boxes.length === 0) list.append(el("li", { class: "grey" }, "no boxes on this clone"));
}

function part(title, doc, draw) {
  const box = el("div", {}, el("h2", {}, title));
  if (doc && doc.error) box.append(el("p", { class: "problem" }, "not read: " + doc.error));
  else box.append(draw(doc));
  return box;
}

function policy(s) {
  const rows = s.enforced.map((e) =>
    el("tr", {}, el("td", {}, e.what), el("td", {}, e.asked),
      el("td", { class: e.enforced ? "" : "no" }, e.enforced ? "enforced" : "not enforced" + (e.note ? ": " + e.note : ""))));
  const t = el("table", {},
    el("tr", {}, el("th", {}, "tier"), el("td", { colspan: 2 }, s.tier + " (" + s.tier_chosen_by + ")")),
    el("tr", {}, el("th", {}, "profile"), el("td", { colspan: 2 }, s.profile)),
    el("tr", {}, el("th", {}, "digest"), el("td", { colspan: 2, class: "digest" }, s.policy_digest + " (verified)")),
    ...rows);
  const out = el("div", {}, t);
  if (s.unenforced_reason) out.append(el("p", { class: "problem" }, s.unenforced_reason));
  return out;
}

function services(s) {
  if (s.services.length === 0) return el("p", { class: "hint" }, "none declared");
  return el("table", {}, ...s.services.map((v) =>
    el("tr", {}, el("td", {}, v.service), el("td", {}, v.alive ? "alive" : "dead"),
      el("td", {}, v.host_port ? "127.0.0.1:" + v.host_port + " \u2192 " + v.port : (v.port ? "port " + v.port : "no port")),
      el("td", {}, v.command))));
}

function diffstat(d) {
  const out = el("div", {}, el("pre", {}, d.lines.length ? d.lines.join("\n") : "no changes against the pinned base"));
  for (const u of d.unread) out.append(el("p", { class: "problem" }, "not in the diff: " + u));
  return out;
}

function flight(doc) {
  const head = el("tr", {}, el("th", {}, "#"), el("th", {}, "when"), el("th", {}, "evidence"),
    ...doc.lanes.map((l) => el("th", {}, l)));
  const rows = doc.flight.map((r) =>
    el("tr", {
      class: r.colour + (state.receipt === r.seq ? " open" : ""),
      "data-seq": r.seq,
      onclick: () => openReceipt(doc.name, r.seq),
    }, el("td", {}, "#" + r.seq), el("td", {}, r.at), el("td", {}, r.evidence + " (" + r.lane + ")"),
    ...r.cells.map((c) => el("td", {}, c === null ? "" : c))));
  const t = el("table", { class: "flight" }, head, ...rows);
  const out = el("div", {}, t);
  if (doc.flight.length === 0) out.append(el("p", { class: "hint" }, "no receipts yet"));
  for (const d of doc.damaged) out.append(el("p", { class: "problem" }, "receipt log " + d));
  out.append(el("div", { id: "receipt" }));
  return out;
}

async function drawDetail() {
  if (state.picked === null) return;
  const section = document.getElementById("detail");
  let doc;
  try {
    doc = await get("api/box/" + encodeURIComponent(state.picked));
  } catch (e) {
    section.replaceChildren(el("p", { class: "problem" }, String(e.message)));
    return;
  }
  const st = doc.status.error ? null : doc.status;
  section.replaceChildren(
    el("div", { class: "boxhead" }, el("span", { class: "name" }, doc.name),
      st ? el("span", { class: "meta" }, st.state + " \u00b7 " + st.source + " \u00b7 base " + st.base.slice(0, 12) +
        (st.drift ? " \u00b7 " + st.drift.branch + " is " + st.drift.ahead + " commit(s) ahead" : "")) : null),
    el("div", { class: "cols" },
      part("Enforced policy", doc.status, policy),
      el("div", {},
        part("Services", doc.services, services),
        part("Diffstat against the pinned base", doc.diffstat, diffstat))),
    el("h2", {}, "Flight recorder"),
    flight(doc));
  if (state.receipt !== null) await openReceipt(doc.name, state.receipt);
}

async function openReceipt(name, seq) {
  state.receipt = seq;
  for (const tr of document.querySelectorAll("table.flight tr[data-seq]")) {
    tr.classList.toggle("open", Number(tr.dataset.seq) === seq);
  }
  const slot = document.getElementById("receipt");
  try {
    const doc = await get("api/box/" + encodeURIComponent(name) + "/receipt/" + seq);
    slot.replaceChildren(el("h2", {}, "Receipt #" + seq), el("pre", { class: "rendered" }, doc.lines.join("\n")));
  } catch (e) {
    slot.replaceChildren(el("p", { class: "problem" }, String(e.message)));
  }
}

async function pick(name) {
  state.picked = name;
  state.receipt = null;
  for (const li of document.querySelectorAll("#boxes li")) {
    li.classList.toggle("picked", li.dataset.box === name);
  }
  await drawDetail();
}

async function follow() {
  const live = document.getElementById("live");
  for (;;) {
    try {
      const q = state.version === null ? "" : "?seen=" + encodeURIComponent(state.version);
      const doc = await get("api/changes" + q);
      live.textContent = "live";
      live.classList.add("on");
      if (doc.version !== state.version) {
        state.version = doc.version;
        await drawFleet();
        await drawDetail();
      }
    } catch (e) {
      live.textContent = "disconnected: " + e.message;
      live.classList.remove("on");
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
}

const first = new URLSearchParams(location.hash.slice(1)).get("box");
if (first) state.picked = first;
follow();
