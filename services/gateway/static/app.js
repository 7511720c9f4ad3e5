// The pathologist's page: add a case's files, pick a request class, watch each site's
// matches arrive. Talks only to the gateway (same origin); no libraries, works offline.
"use strict";

const state = {
  config: null,          // GET /api/config
  sites: [],             // site names, in the order the rows are drawn
  files: new Map(),      // file name -> File, for files small enough to send
  uploads: new Map(),    // file name -> its upload (see stage()): each file is uploaded and
                         // checked as soon as it is chosen, so that sending only names ids
  previews: new Map(),   // cell id -> object URL of its image (for the results)
  csrf: "",              // the session's CSRF token (GET /api/session)
  tooLarge: [],          // [{file, problem}] found before sending
  pairing: null,         // POST /api/pair reply
  running: false,
  finished: false,       // the case's stream ended with its summary or an error
  started: 0,
  timer: null,
  predicted: null,       // the case's wait on this page's path: the slowest site's (null: none)
  planAt: 0,             // performance.now() when the case's plan arrived
  remainder: 0,          // the page's own unforeseen seconds in the case's wait (link.js pathRemainder)
  report: null,          // what the case report is made of, filled as the case runs
  reportURL: null,       // the object URL of the last report saved
  siteInfo: new Map(),   // site name -> its /api/sites entry (database size and origins)
  images: new Map(),     // image hash -> object URL of a database cell's full image (cached by hash)
  querySizes: new Map(), // cell id -> [width, height] of its test image, in pixels
  viewer: null,          // {queryId, site, matches, index} while the viewer is open
  weights: {},           // the concept weights of the case on screen (refine by concept)
  refined: [],           // those weights in words, said beside a re-ranked answer's conclusion
  answered: null,        // {accession} as typed when the case on screen was answered
};

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

// A signed-out session (expired, or signed out elsewhere) brings back the sign-in form.
class SignedOut extends Error {}

async function getJSON(url, options) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({}));
  if (response.status === 401) { showLogin(body.error); throw new SignedOut(body.error || "Please sign in."); }
  if (!response.ok) throw wordsError(body, `${url}: HTTP ${response.status}`);
  return body;
}

// An error the page shows in words ("The coordinator is not reachable; is it running?"),
// keeping the technical message for the tooltip.
function wordsError(body, fallback) {
  const err = new Error(body.words || body.error || fallback);
  err.detail = body.error || fallback;
  return err;
}

// The one place the coordinator's state is told: a banner under the title.
function showBanner(text, detail = "") {
  const banner = $("#banner");
  banner.textContent = text;
  banner.title = detail;
  banner.hidden = !text;
}

// Every state-changing request carries the session's CSRF token.
const csrfHeaders = (extra = {}) => ({...extra, "X-CSRF-Token": state.csrf || ""});

const postJSON = (url, obj) => getJSON(url, {
  method: "POST", headers: csrfHeaders({"Content-Type": "application/json"}), body: JSON.stringify(obj),
});

// ---------------------------------------------------------------- signing in

function showLogin(message) {
  $("#app").hidden = true;
  $("#who").hidden = true;
  $("#login").hidden = false;
  const error = $("#login-error");
  error.textContent = message && message !== "Please sign in." ? message : "";
  error.hidden = !error.textContent;
  $("#login-name").focus();
}

async function signIn(event) {
  event.preventDefault();
  try {
    await getJSON("/api/login", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({name: $("#login-name").value, password: $("#login-password").value})});
    location.reload();
  } catch (err) {
    showLogin(err.message);
  }
}

async function signOut() {
  await fetch("/api/logout", {method: "POST", headers: csrfHeaders()}).catch(() => null);
  location.reload();
}

// ---------------------------------------------------------------- diagnoses

// Severity drives the colour, so a glance tells normal from abnormal.
const SEVERITY = {
  normal_superficial: 0, normal_intermediate: 0, normal_columnar: 0,
  mild_dysplasia: 1, moderate_dysplasia: 2, severe_dysplasia: 3, carcinoma_in_situ: 4,
};

// Short names fit under a thumbnail; the full name is in the tooltip and the viewer.
const SHORT = {
  normal_superficial: "superficial", normal_intermediate: "intermediate",
  normal_columnar: "columnar", mild_dysplasia: "mild", moderate_dysplasia: "moderate",
  severe_dysplasia: "severe", carcinoma_in_situ: "CIS",
};

const fullName = (diagnosis) => (diagnosis || "unknown").replaceAll("_", " ");

function diagnosisBadge(diagnosis, extra, short = false) {
  const level = diagnosis in SEVERITY ? SEVERITY[diagnosis] : "unknown";
  const label = short && SHORT[diagnosis] ? SHORT[diagnosis] : fullName(diagnosis);
  return el("span", {class: `dx dx-${level}`, title: fullName(diagnosis)}, label, extra ? ` ${extra}` : "");
}

const seconds = (s) => `${s.toFixed(s < 10 ? 2 : 1)} s`;
const megabytes = (n) => `${(n / 1e6).toFixed(1)} MB`;
// A date and time no reader can take for another: ISO 8601 in local time with its offset,
// "2026-12-02 04:31 +00:00".
function isoTime(date) {
  const two = (n) => String(Math.abs(n)).padStart(2, "0");
  const offset = -date.getTimezoneOffset();
  return `${date.getFullYear()}-${two(date.getMonth() + 1)}-${two(date.getDate())} ${two(date.getHours())}:${
    two(date.getMinutes())} ${offset < 0 ? "-" : "+"}${two(Math.trunc(offset / 60))}:${two(offset % 60)}`;
}

// Bytes in the unit that shows them: 812 B, 14 kB, 1.8 MB.
const bytesText = (n) => n < 1e3 ? `${n} B` : n < 1e6 ? `${Math.round(n / 1e3)} kB` : megabytes(n);
// The fewest cases whose times make a distribution worth showing.
const FEW_CASES = 5;

// ---------------------------------------------------------------- sites

async function loadSites() {
  try {
    const reply = await getJSON("/api/sites");
    state.sites = reply.sites.map((s) => s.site);
    for (const s of reply.sites) state.siteInfo.set(s.site, s);
    renderChips(reply.sites.map((s) => ({
      site: s.site, cls: s.serving ? "ok" : "down",
      text: s.serving ? databaseNote(s) || `${s.database_cells} cells` : "not serving",
    })));
    showBanner("");
  } catch (err) {
    if (err instanceof SignedOut) return;
    renderChips([]);
    showBanner(err.message, err.detail);
  }
}

function renderChips(chips) {
  $("#site-chips").replaceChildren(...chips.map((c) =>
    el("li", {class: `chip chip-${c.cls}`, "data-site": c.site},
      el("strong", {text: c.site}), " ", el("span", {text: c.text}))));
}

function ensureSite(site) {
  if (!state.sites.includes(site)) state.sites.push(site);
}

// ---------------------------------------------------------------- request classes

// The classes are the coordinator's (its Info, through the gateway): a deployment that
// re-maps them shows its own names and descriptions here.
async function loadConfig() {
  state.config = await getJSON("/api/config");
  renderClasses();
}

function renderClasses() {
  const box = $("#classes");
  box.querySelectorAll(".class-option, .class-error").forEach((node) => node.remove());
  // Only the kinds this user may send; while the coordinator cannot be asked, none (the
  // banner says why once, and a case goes as the default kind).
  for (const c of state.config.classes.filter((c) => c.allowed)) {
    const id = `class-${c.name}`;
    box.append(el("label", {class: "class-option", for: id},
      el("input", {type: "radio", name: "request-class", id, value: c.name,
        checked: c.name === state.config.default_class, onchange: loadStats}),
      el("span", {class: "class-name", text: c.label}),
      el("span", {class: "class-desc", text: c.hint})));
  }
}

// The words for a kind of case ("Intra-operative — fastest"), from the gateway.
const classLabel = (name) =>
  (state.config && state.config.classes.find((c) => c.name === name) || {label: name}).label;

// Classes the coordinator could not be asked for at start-up are asked for again later.
async function refreshClasses() {
  if (state.config.classes.length) return;
  try {
    state.config = await getJSON("/api/config");
    renderClasses();
  } catch (err) { /* the gateway itself is gone: the case or the stats say so */ }
}

// The chosen class; before the coordinator has listed its classes, the default one (a
// case sent then reports why the coordinator cannot be reached).
const chosenClass = () =>
  document.querySelector("input[name=request-class]:checked")?.value ?? state.config.default_class;

async function loadStats() {
  await refreshClasses();
  const cls = chosenClass();
  const label = classLabel(cls);
  const box = $("#expect");
  if (!$("#banner").hidden) { box.replaceChildren(); return; }  // the banner has said why
  try {
    const s = await getJSON(`/api/stats?class=${encodeURIComponent(cls)}`);
    if (!s.cases) {
      box.replaceChildren(el("span", {class: "muted", text: `No ${label} cases yet: no waiting times to show.`}));
      return;
    }
    // The kind's past cases at the coordinator, and this page's link for the cells picked.
    const cells = Math.max(1, state.pairing?.cells?.length || 0);
    box.replaceChildren(
      el("div", {class: "expect-line"},
        el("span", {class: "expect-label", text: "Expect about "}),
        el("strong", {class: "expect-mean", text: seconds(s.mean_s + linkSeconds(cells * answerBytes()))}),
        s.cases > 1 ? el("span", {class: "expect-spread", text: ` ± ${seconds(s.std_s)}`}) : null),
      el("div", {class: "muted", "data-cases": s.cases, text: s.cases >= FEW_CASES
        ? `${label}: last ${s.cases} cases, median ${seconds(s.p50_s)}, 95% under ${seconds(s.p95_s)}`
        : `${label}: only ${s.cases} case${s.cases === 1 ? "" : "s"} so far; a spread needs ${FEW_CASES}.`}),
      sparkline(s.recent_s, s.mean_s));
  } catch (err) {
    if (!(err instanceof SignedOut)) box.replaceChildren(el("span", {class: "muted", text: "No waiting times to show."}));
  }
}

// Recent completion times as dots (oldest left), with the mean as a line.
function sparkline(values, mean) {
  const ns = "http://www.w3.org/2000/svg";
  const w = 240, h = 44, pad = 5;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `recent times: ${values.map((v) => v.toFixed(2)).join(", ")} s`);
  if (!values.length) return svg;
  const top = Math.max(...values) * 1.1 || 1;
  const y = (v) => h - pad - (v / top) * (h - 2 * pad);
  const x = (i) => values.length === 1 ? w / 2 : pad + (i * (w - 2 * pad)) / (values.length - 1);
  const line = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({x1: 0, x2: w, y1: y(mean), y2: y(mean), class: "mean"})) line.setAttribute(k, v);
  svg.append(line);
  values.forEach((v, i) => {
    const dot = document.createElementNS(ns, "circle");
    for (const [k, a] of Object.entries({cx: x(i), cy: y(v), r: 3})) dot.setAttribute(k, a);
    svg.append(dot);
  });
  return svg;
}

// ---------------------------------------------------------------- adding files

function addFiles(fileList) {
  const limit = state.config.max_file_bytes;
  if (state.answered && !state.running) {
    // The first file after an answer starts the next case: the last one's files and
    // results go; its accession number too, unless another was typed since.
    const typedAnew = $("#accession").value !== state.answered.accession;
    for (const name of [...state.uploads.keys()]) dropUpload(name);
    state.files.clear();
    state.tooLarge = [];
    state.pairing = null;
    resetResults(!typedAnew);
  }
  for (const file of fileList) {
    state.tooLarge = state.tooLarge.filter((p) => p.file !== file.name);
    if (file.size > limit) {
      // Never sent: the message stays where the file was added.
      state.files.delete(file.name);
      dropUpload(file.name);
      state.tooLarge.push({file: file.name,
        problem: `too large: ${megabytes(file.size)}, the limit is ${megabytes(limit)} per file`});
    } else {
      state.files.set(file.name, file);
      stage(file);
    }
  }
  refreshPairing();
}

// ---------------------------------------------------------------- uploading as files are chosen

// Each chosen file goes to the gateway at once (POST /api/upload), a few at a time, which
// checks it (decodes it as what its name says) and holds it for this user; "Find similar
// cells" then sends only the files' ids. An upload: {file, status: queued | uploading |
// ready | failed, id, loaded, total, problem, done (a promise), xhr}.
const UPLOADS_AT_ONCE = 4;
const uploadQueue = [];
let uploadsRunning = 0;

function stage(file) {
  dropUpload(file.name);  // a file of the same name chosen again replaces the first
  const upload = {file, status: "queued", id: null, loaded: 0, total: file.size, problem: "", xhr: null};
  upload.done = new Promise((resolve) => { upload.resolve = resolve; });
  state.uploads.set(file.name, upload);
  uploadQueue.push(upload);
  pumpUploads();
  return upload.done;
}

function dropUpload(name) {
  const old = state.uploads.get(name);
  state.uploads.delete(name);
  if (old && old.xhr) old.xhr.abort();
  if (old) old.resolve();
}

const current = (upload) => state.uploads.get(upload.file.name) === upload;

function pumpUploads() {
  while (uploadsRunning < UPLOADS_AT_ONCE && uploadQueue.length) {
    const upload = uploadQueue.shift();
    if (!current(upload)) continue;  // replaced or cleared while it waited
    uploadsRunning++;
    sendUpload(upload).finally(() => {
      uploadsRunning--;
      upload.resolve();
      pumpUploads();
      if (current(upload)) uploadSettled(upload);
    });
  }
}

// XMLHttpRequest, not fetch: it reports the upload's progress.
function sendUpload(upload) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    upload.xhr = xhr;
    upload.status = "uploading";
    showUpload(upload);
    xhr.open("POST", "/api/upload");
    xhr.setRequestHeader("X-CSRF-Token", state.csrf || "");
    xhr.responseType = "json";
    xhr.upload.onprogress = (e) => {
      if (!e.lengthComputable) return;
      upload.loaded = e.loaded;
      upload.total = e.total;
      showUpload(upload);
    };
    xhr.onload = () => {
      const body = xhr.response || {};
      if (xhr.status === 200) {
        upload.status = "ready";
        upload.id = body.id;
        upload.size = [body.width, body.height];
      } else {
        upload.status = "failed";
        upload.problem = body.problem || body.words || body.error || `the gateway answered HTTP ${xhr.status}`;
        upload.code = body.code || null;
        if (xhr.status === 401) showLogin(body.error);
      }
      resolve();
    };
    xhr.onerror = () => {
      upload.status = "failed";
      upload.problem = "the file did not reach the gateway; check the connection and add it again";
      resolve();
    };
    xhr.onabort = () => resolve();
    const form = new FormData();
    form.append("file", upload.file, upload.file.name);
    xhr.send(form);
  });
}

// A refused file leaves the case (its problem is listed where files are added).
function uploadSettled(upload) {
  upload.xhr = null;
  if (upload.status === "failed") {
    state.files.delete(upload.file.name);
    refreshPairing();
  } else {
    renderPairing();
  }
}

const pendingUploads = () => [...state.uploads.values()].filter((u) => u.status === "queued" || u.status === "uploading");

// One file's state where the case's files are listed: a progress bar while it uploads.
function uploadMark(name) {
  const upload = state.uploads.get(name);
  const status = upload ? upload.status : "ready";
  const mark = el("span", {class: `file-mark ${status === "ready" ? "yes" : status}`, "data-upload": name, title: name});
  if (status === "queued" || status === "uploading") {
    const fraction = upload.total ? upload.loaded / upload.total : 0;
    mark.append(el("progress", {max: 1, value: fraction, "aria-label": `${name}: uploading`}),
      ` ${name}`);
  } else {
    mark.append(`${status === "ready" ? "✓" : "✗"} ${name}`);
  }
  return mark;
}

function showUpload(upload) {
  for (const node of document.querySelectorAll(`[data-upload="${CSS.escape(upload.file.name)}"]`)) {
    node.replaceWith(uploadMark(upload.file.name));
  }
}

let pairingAsked = 0;  // the newest /api/pair request; older replies are stale

async function refreshPairing() {
  const asked = ++pairingAsked;
  let pairing;
  try {
    pairing = await postJSON("/api/pair", {names: [...state.files.keys()]});
  } catch (err) {
    pairing = {cells: [], problems: [{file: "(pairing)", problem: err.message}]};
  }
  // Files added in quick succession (a pick, then a drop) ask twice; the replies may come
  // back in either order, and only the answer about the newest set of files may be shown.
  if (asked !== pairingAsked) return;
  state.pairing = pairing;
  for (const url of state.previews.values()) URL.revokeObjectURL(url);
  state.previews.clear();
  for (const cell of state.pairing.cells) {
    state.previews.set(cell.cell_id, URL.createObjectURL(state.files.get(cell.image)));
  }
  renderPairing();
}

function fileMark(name) {
  return name ? uploadMark(name)
              : el("span", {class: "muted", title: "will be estimated by each site", text: "estimated"});
}

function renderPairing() {
  const cells = state.pairing ? state.pairing.cells : [];
  const rows = cells.map((c) => el("tr", {"data-cell": c.cell_id},
    el("th", {scope: "row"},
      el("img", {class: "preview", src: state.previews.get(c.cell_id), alt: "",
        onerror: (e) => { e.target.replaceWith(el("span", {class: "preview no-preview",
          title: "the browser cannot show this file; the gateway checks it as it arrives",
          text: "?"})); }}),
      el("span", {text: c.cell_id}), " ", uploadMark(c.image)),
    el("td", {}, fileMark(c.background)), el("td", {}, fileMark(c.mask))));
  $("#pairing tbody").replaceChildren(...rows);
  $("#pairing").hidden = rows.length === 0;
  const refused = [...state.uploads.values()].filter((u) => u.status === "failed")
    .map((u) => ({file: u.file.name, problem: u.problem, code: u.code}));
  const problems = [...state.tooLarge, ...refused, ...(state.pairing ? state.pairing.problems : []),
                    ...sizeProblems(cells)];
  $("#file-problems").replaceChildren(...problems.map((p) =>
    el("li", {class: "error", "data-file": p.file, "data-code": p.code || null},
      el("strong", {text: p.file}), `: ${p.problem}`)));
  const pending = pendingUploads().length;
  $("#submit").disabled = state.running || rows.length === 0 || pending > 0 || sizeProblems(cells).length > 0
    || !accession().ok;
  if (!state.running) {
    setStatus(pending ? `Adding ${pending} file${pending === 1 ? "" : "s"}…`
      : rows.length
      ? `${rows.length} cell${rows.length === 1 ? "" : "s"} ready. Choose the kind of case and press “Find similar cells”.`
      : "Add a case's cell images to start.");
  }
}

// A background or mask must have its cell image's pixel size: checked when both are staged.
function sizeProblems(cells) {
  const out = [];
  for (const c of cells) {
    const image = state.uploads.get(c.image);
    for (const name of [c.background, c.mask].filter(Boolean)) {
      const other = state.uploads.get(name);
      if (!image || !other || !image.size || !other.size) continue;
      if (image.size[0] !== other.size[0] || image.size[1] !== other.size[1]) {
        out.push({file: name, code: "companion_size", problem:
          `${other.size[0]} × ${other.size[1]} pixels, but ${c.image} is ${image.size[0]} × ${image.size[1]}: ` +
          "choose the matching file"});
      }
    }
  }
  return out;
}

function clearCase() {
  for (const name of [...state.uploads.keys()]) dropUpload(name);
  fetch("/api/upload", {method: "DELETE", headers: csrfHeaders()}).catch(() => null);
  state.files.clear();
  state.tooLarge = [];
  state.pairing = null;
  resetResults(true);
  refreshPairing();
}

// Each case is its own: nothing of the last patient's case stays on screen or goes into the
// next one. "Clear" and the first file of a new case (added after an answer) take away the
// conclusion, results, site cards, report, refine weights and status; the accession number
// too, unless it was typed anew for the next case (forgetAccession false keeps it).
function resetResults(forgetAccession) {
  if ($("#viewer").open) $("#viewer").close();
  $("#cells").replaceChildren();
  $("#site-cards").replaceChildren();
  const box = $("#conclusion");
  box.hidden = true;
  delete box.dataset.outcome;
  delete box.dataset.codes;
  $("#conclusion-text").replaceChildren();
  $("#decision-support").textContent = "";
  $("#conclusion-detail").textContent = "";
  $("#refine").hidden = true;
  for (const select of document.querySelectorAll("#refine-concepts select")) select.value = "1";
  state.weights = {};
  state.refined = [];
  $("#reranked").hidden = true;
  state.report = null;
  state.finished = false;
  $("#export").disabled = true;
  if (forgetAccession) $("#accession").value = "";
  state.answered = null;
  showAccession();
  setStatus("Add a case's cell images to start.");
  $("#images-line").hidden = true;
  delete $("#case-status").dataset.waitedS;
  $("#case-status").title = "";
}

// ---------------------------------------------------------------- accession number

// An accession number as typed ("S26/01234", "S26 01234") and as sent: "/" and spaces
// become "-", so common formats go through; anything else the gateway's rule refuses is
// said here, before sending.
const ACCESSION_RULE = /^[A-Za-z0-9._:-]{1,64}$/;

function accession() {
  const typed = $("#accession").value.trim();
  const sent = typed.replace(/[\/\s]+/g, "-");
  return {typed, sent, ok: !sent || ACCESSION_RULE.test(sent)};
}

function showAccession() {
  const a = accession();
  const note = $("#accession-note");
  note.className = a.ok ? "help" : "help error";
  note.textContent = !a.ok ? "Use letters, digits and . _ : - / or spaces (up to 64)."
    : a.sent !== a.typed ? `Sent as ${a.sent}` : "";
  renderPairing();
}

// ---------------------------------------------------------------- results

async function submitCase(weights = {}) {
  const cls = chosenClass();
  state.weights = weights;
  if (!accession().ok) { showAccession(); return; }  // refused before anything is sent
  state.running = true;
  $("#submit").disabled = true;
  $("#cells").replaceChildren();
  $("#site-cards").replaceChildren();  // drawn once the gateway has accepted the case
  $("#conclusion").hidden = true;
  const refined = Object.entries(weights).map(([c, w]) =>
    `${CONCEPT_LABELS.find(([k]) => k === c)[1].toLowerCase()} ${WEIGHT_CHOICES.find(([v]) => v === w)[1]}`);
  state.refined = refined;
  setStatus(`Sending ${state.files.size} files (${classLabel(cls)})${refined.length ? `, re-ranked: ${refined.join(", ")}` : ""}…`);
  state.started = performance.now();
  state.predicted = null;
  state.report = {accession: accession().sent, kind: classLabel(cls),
                  user: $("#who-name").textContent, started: new Date(), predicted_s: null,
                  cells: [], rejected: [], sites: new Map(), summary: null};
  $("#export").disabled = true;
  state.timer = setInterval(tick, 200);
  try {
    let response = await postCase(cls);
    if (response.status === 409) {
      // Files the gateway no longer holds (they expire when unused): add them again, once.
      const body = await response.json().catch(() => ({}));
      setStatus("Adding some of the case's files again…");
      await Promise.all((body.missing || []).filter((name) => state.files.has(name))
        .map((name) => stage(state.files.get(name))));
      response = await postCase(cls);
    }
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      if (response.status === 401) showLogin(body.error);
      throw wordsError(body, `HTTP ${response.status}`);
    }
    state.finished = false;
    await readEvents(response, handleEvent);
    if (!state.finished) throw new Error("the gateway's stream ended before the case finished");
  } catch (err) {
    setStatus(`The case could not be run: ${err.message}`, "error");
    $("#case-status").title = err.detail || "";
  } finally {
    clearInterval(state.timer);
    state.running = false;
    $("#submit").disabled = !(state.pairing && state.pairing.cells.length);
    for (const card of document.querySelectorAll(".site-card.waiting")) {
      markSite(card.dataset.site, "down", "no answer");
    }
    document.body.dataset.caseDone = String(Date.now());
    loadStats();
  }
}

// The case names its files by the ids their uploads were given; no image goes with it.
function postCase(cls) {
  const files = [...state.files.keys()].filter((name) => state.uploads.get(name)?.status === "ready")
    .map((name) => ({name, id: state.uploads.get(name).id}));
  return fetch("/api/case", {method: "POST", headers: csrfHeaders({"Content-Type": "application/json"}),
    body: JSON.stringify({request_class: cls, case_id: accession().sent, files, concept_weights: state.weights || {}})});
}

// The case's reply is newline-delimited JSON, one event per line, as sites answer.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, {stream: true});
    let newline;
    while ((newline = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (line.trim()) onEvent(JSON.parse(line), line.length);
    }
  }
}

function handleEvent(event, bytes = 0) {
  if (event.type === "accepted") onAccepted(event);
  else if (event.type === "plan") { state.planAt = performance.now(); onPlan(event); }
  else if (event.type === "site") {
    const beyond = (performance.now() - state.planAt) / 1000 - (event.timing?.total_s || 0);
    noteAnswer(event.site, bytes, event.cells.length, beyond);
    onSite(event);
  }
  else if (event.type === "summary") onSummary(event);
  else if (event.type === "error") onError(event);
  if (event.type === "summary" || event.type === "error") state.finished = true;
}

// A case that could not run: said once, in words, where the case's status is (the banner
// steps aside when it was saying the same).
function onError(event) {
  const words = event.words || event.message;
  if ($("#banner").textContent === words) showBanner("");
  setStatus(words, "error");
  $("#case-status").title = event.message;
}

function setStatus(text, cls = "") {
  const status = $("#case-status");
  status.textContent = text;
  status.className = `case-status ${cls}`;
}

// Every 200 ms while a case runs: the time so far, against each site's predicted time.
function tick() {
  const waiting = document.querySelectorAll(".site-card.waiting").length;
  const elapsed = (performance.now() - state.started) / 1000;
  const expected = state.predicted ? ` of about ${seconds(state.predicted)} expected` : "";
  if (waiting) setStatus(`Waiting for ${waiting} site${waiting === 1 ? "" : "s"}… ${seconds(elapsed)}${expected}`);
  for (const card of document.querySelectorAll(".site-card.waiting")) {
    const predicted = Number(card.dataset.predictedS) || 0;
    card.querySelector(".site-time").textContent = predicted
      ? `${seconds(elapsed)} of ~${seconds(predicted)}` : seconds(elapsed);
    const bar = card.querySelector("progress");
    // Past its prediction a site's bar stays just short of full until it answers.
    if (predicted) bar.value = Math.min(elapsed / predicted, 0.97);
  }
}

function onAccepted(event) {
  if (event.cells.length) $("#site-cards").replaceChildren(...state.sites.map((s) => siteCard(s)));
  state.report.cells = event.cells;
  state.report.rejected = event.rejected;
  const cells = event.cells.map((id) => cellCard(id));
  // A rejected cell keeps its place in the case, with the reason where its results would be.
  const rejected = event.rejected.map((r) => el("article", {class: "cell-card rejected", "data-cell": r.name},
    el("header", {class: "cell-head"}, el("h3", {text: r.name})),
    el("p", {class: "error", role: "alert"}, el("strong", {text: "Not analysed: "}), r.problem)));
  $("#cells").replaceChildren(...cells, ...rejected);
  setStatus(`${event.cells.length} cell${event.cells.length === 1 ? "" : "s"} sent to ${state.sites.length} sites (${classLabel(event.request_class)}).`);
}

// The coordinator's plan arrives before any result: the wait for each site on the
// pathologist's own path (link.js: the coordinator's prediction and this page's link), and
// the case's, the slowest site's, which the status and the side panel say.
function onPlan(event) {
  const cells = state.report.cells.length;
  // A site sent features waits for the coordinator's analysis of the cells first.
  const coordinator = event.sites.map((s) => s.predicted_s &&
    s.predicted_s + (s.mode === "features" ? event.analysis_s || 0 : 0));
  const waits = event.sites.map((s, i) => siteWait(s.site, coordinator[i], cells));
  state.predicted = waits.length && waits.every((w) => w) ? Math.max(...waits) : null;
  state.remainder = pathRemainder();  // in the waits; what the next case learns is beyond it
  state.report.predicted_s = state.predicted;
  document.body.dataset.caseWaitS = state.predicted ?? "";
  const wait = state.predicted ? `expected in about ${seconds(state.predicted)}` : "no estimate yet (the first cases of a kind teach the estimate)";
  setStatus(`Case sent; ${wait}.`);
  showCaseWait(state.predicted);
  event.sites.forEach((s, i) => {
    ensureSite(s.site);
    const card = document.querySelector(`.site-card[data-site="${CSS.escape(s.site)}"]`);
    if (!card) return;
    // Only the site's card: its cells' rows stay pending until the site answers.
    if (waits[i]) {
      card.dataset.predictedS = waits[i];
      card.dataset.coordinatorS = coordinator[i];
      card.querySelector(".site-expected").textContent = `expected in ~${seconds(waits[i])}`;
      card.querySelector("progress").value = 0;
    }
    const why = s.why || [];
    card.querySelector(".site-detail").replaceChildren(...cardReasons(why).map((r) =>
      el("span", {class: "reason", "data-code": r.code, title: reasonDetail(r), text: reasonWords(r)})));
  });
}

// While a case runs the side panel says the case's own wait, the one the status counts
// against, instead of the kind's past cases (loadStats puts those back after).
function showCaseWait(wait) {
  $("#expect").replaceChildren(wait ? el("div", {class: "expect-line", "data-case-wait": wait},
    el("span", {class: "expect-label", text: "This case: about "}),
    el("strong", {class: "expect-mean", text: seconds(wait)})) : "");
}

// A site card's reasons in words, but for the coordinator's own prediction ("predicted"):
// the card says its wait once, on this page's path (onPlan), not a second time.
const cardReasons = (why) => plainReasons(why).filter((r) => r.code !== "predicted");

// A site's card: its state, its time against its prediction, and a progress bar (without
// a prediction the bar only says the site is being waited for).
function siteCard(site) {
  return el("li", {class: "site-card waiting", "data-site": site},
    el("div", {class: "site-name", text: site}),
    el("div", {class: "site-state", text: "waiting"}),
    el("progress", {class: "site-progress", max: 1, "aria-label": `${site}: progress`}),
    el("div", {class: "site-time", text: ""}),
    el("div", {class: "site-expected muted"}),
    el("div", {class: "site-detail"}));
}

function markSite(site, cls, stateText, timeText = "", detail = "") {
  let card = document.querySelector(`.site-card[data-site="${CSS.escape(site)}"]`);
  if (!card) {
    card = siteCard(site);
    $("#site-cards").append(card);
  }
  card.className = `site-card ${cls}`;
  card.querySelector("progress").value = 1;
  card.querySelector(".site-state").textContent = stateText;
  card.querySelector(".site-time").textContent = timeText;
  card.querySelector(".site-detail").textContent = detail;
  for (const row of document.querySelectorAll(`.site-row[data-site="${CSS.escape(site)}"].pending`)) {
    row.classList.remove("pending");
    // The full reason is on the site's card; each cell's row just says the site failed.
    if (cls !== "ok") fillRowError(row, `${stateText}: no matches from ${site} (see its card above)`);
  }
}

function cellCard(cellId) {
  const card = el("article", {class: "cell-card", "data-cell": cellId},
    el("header", {class: "cell-head"},
      el("h3", {text: cellId}),
      el("img", {class: "query", src: state.previews.get(cellId), alt: `test cell ${cellId}`}),
      el("span", {class: "vote muted", text: "term when all sites answer"}),
      el("span", {class: "spread"}),
      el("span", {class: "flags"})),
    el("div", {class: "site-rows"}, ...state.sites.map((s) => siteRow(s))));
  return card;
}

function siteRow(site) {
  const note = databaseNote(state.siteInfo.get(site));
  return el("div", {class: "site-row pending", "data-site": site},
    el("div", {class: "row-site"}, el("span", {text: site}),
      note ? el("span", {class: "db-note", "data-note": "database", text: note}) : null),
    // Five grey tiles where the matches will land, so nothing jumps when they arrive.
    el("div", {class: "matches", "aria-label": `waiting for ${site}`},
      ...Array.from({length: 5}, () => el("span", {class: "match-placeholder"}))));
}

function rowFor(cellId, site) {
  const card = document.querySelector(`.cell-card[data-cell="${CSS.escape(cellId)}"]`);
  if (!card) return null;
  let row = card.querySelector(`.site-row[data-site="${CSS.escape(site)}"]`);
  if (!row) {
    row = siteRow(site);
    card.querySelector(".site-rows").append(row);
  }
  return row;
}

function fillRowError(row, message) {
  row.classList.add("failed");
  row.querySelector(".matches").replaceChildren(el("span", {class: "error", role: "alert", text: message}));
}

function onSite(event) {
  ensureSite(event.site);
  state.report.sites.set(event.site, event);
  const t = event.timing;
  if (event.ok) {
    markSite(event.site, "ok", "answered", seconds(t.total_s), "");
    const card = document.querySelector(`.site-card[data-site="${CSS.escape(event.site)}"]`);
    card.title = `transfer ${seconds(t.transfer_s)} · features ${seconds(t.extraction_s)} · search ${seconds(t.search_s)}`;
    card.querySelector(".site-detail").replaceChildren(...cardReasons(event.why).map((r) =>
      el("span", {class: "reason", "data-code": r.code, title: reasonDetail(r), text: reasonWords(r)})));
  } else {
    markSite(event.site, "down", event.status_words, t.total_s ? seconds(t.total_s) : "");
    document.querySelector(`.site-card[data-site="${CSS.escape(event.site)}"]`).title = event.status_message;
  }
  for (const cell of event.cells) {
    const row = rowFor(cell.query_cell_id, event.site);
    if (!row) continue;
    row.classList.remove("pending");
    if (cell.error) {
      fillRowError(row, cell.error);
      continue;
    }
    row.querySelector(".matches").replaceChildren(...cell.matches.map((m, i) =>
      matchTile(cell.query_cell_id, event.site, m, i + 1, cell.matches)));
    const flags = document.querySelector(`.cell-card[data-cell="${CSS.escape(cell.query_cell_id)}"] .flags`);
    const notes = [cell.background_estimated && "background estimated", cell.mask_estimated && "mask estimated"].filter(Boolean);
    flags.textContent = notes.join(" · ");
  }
}

// Similarity is comparable between sites and cases (calibrated on the site's own cells'
// nearest neighbours, computed at the site); the raw distance, which is not, is in the
// tooltip; the test cell's own copy in a site's database is flagged "same cell". Under it, the measure that differs most, in words.
function matchTile(queryId, site, match, rank, matches) {
  const label = fullName(match.diagnosis);
  const {far} = measureSummary(match.measures);
  const why = far.length ? measureWords(far[0], true) : "";
  return el("button", {type: "button", class: `match${match.same_cell ? " same-cell" : ""}`,
      "data-similarity": match.similarity, "data-sha": match.image_sha256, "data-same-cell": String(!!match.same_cell),
      title: `${rank}. ${label}, ${similarityTitle(site, match)}, ${match.source_id}`,
      "aria-label": `match ${rank} from ${site}: ${label}, ${similarityText(match)}${why ? `, ${why}` : ""}. Enlarge.`,
      onclick: () => openViewer(queryId, site, matches, rank - 1)},
    el("img", {src: state.images.get(match.image_sha256) || match.thumbnail, alt: ""}),
    diagnosisBadge(match.diagnosis, "", true),
    el("span", {class: "similarity", text: similarityText(match)}),
    why ? el("span", {class: "why-far", text: why}) : null);
}

// A Bethesda term as a coloured badge (colour by severity).
const termBadge = (term, extra = "") =>
  el("span", {class: `dx dx-${bethesdaLevel(term)}`, "data-term": term}, term || "no term", extra ? ` ${extra}` : "");

function onSummary(event) {
  const waited = (performance.now() - state.started) / 1000;  // the pathologist's wait, click to last answer
  if (state.predicted) noteCaseWait(state.predicted - state.remainder, waited);
  const conclusion = event.conclusion;
  const words = event.conclusion_words;
  const cells = new Map((conclusion ? conclusion.cells : []).map((c) => [c.query_cell_id, c]));
  for (const card of document.querySelectorAll(".cell-card:not(.rejected)")) {
    const c = cells.get(card.dataset.cell);
    const vote = card.querySelector(".vote");
    if (!c) { vote.textContent = "no term"; continue; }
    vote.className = "vote";
    vote.replaceChildren(termBadge(c.bethesda, `${c.support}/${c.total}`));
    vote.title = `${c.support} of ${c.total} matches across sites carry ${c.bethesda || "no term"}`;
    card.querySelector(".spread").replaceChildren(...c.spread.map((t) =>
      el("span", {class: "spread-term", "data-term": t.bethesda, text: `${t.bethesda} ${t.count}`})));
    // The abnormality the case rule reads in this cell (services/conclusion_words.py cell_line).
    if (c.abnormal && c.abnormal_term) {
      card.querySelector(".spread").append(el("strong", {class: "supports", "data-term": c.abnormal_term,
        title: words.cells[c.query_cell_id] || "", text: `supports ${c.abnormal_term}`}));
    }
    card.dataset.term = c.bethesda;
  }
  showConclusion(conclusion, event.conclusion_words);
  // A re-ranked answer says so beside its conclusion: its matches are not the usual ones.
  const reranked = $("#reranked");
  reranked.hidden = !(state.refined && state.refined.length);
  reranked.textContent = reranked.hidden ? "" : `Re-ranked answer (${state.refined.join(", ")}): ` +
    "this conclusion is from the re-ranked matches";
  $("#refine").hidden = false;
  state.answered = {accession: $("#accession").value};
  state.report.summary = event;
  state.report.waited_s = waited;
  $("#export").disabled = false;
  const failed = event.sites_failed ? `, ${event.sites_failed} failed` : "";
  const status = $("#case-status");
  // The case is named by the accession number the pathologist gave, never by an internal id.
  const named = state.report.accession ? `Case ${state.report.accession}: answered` : "Answered";
  setStatus(`${named} in ${seconds(waited)}: ${event.sites_ok} site${event.sites_ok === 1 ? "" : "s"} answered${failed}.`,
    event.sites_failed ? "warn" : "done");
  status.dataset.waitedS = waited.toFixed(3);
  status.title = `from your click to the last answer; the coordinator's own time was ${seconds(event.total_s)}; ` +
    `${bytesText(event.bytes_sent)} sent, ${bytesText(event.bytes_received)} received (PathMaster reference ${event.case_id})`;
  fetchLargerImages();
}

// The case conclusion, first: in words, why, the decision-support statement, and the rule
// and codes for the researcher.
// Words as a sentence on their own: the first letter capital.
const sentence = (text) => text ? text[0].toUpperCase() + text.slice(1) : text;

function showConclusion(c, words) {
  const box = $("#conclusion");
  const outcome = c && c.outcome ? c.outcome : "no_answer";
  box.hidden = false;
  box.dataset.outcome = outcome;
  box.className = `conclusion outcome-${outcome}`;
  $("#conclusion-text").replaceChildren(c && c.bethesda ? termBadge(c.bethesda) : "", " ", sentence(words.headline));
  // A case that cannot be concluded says what to do next.
  $("#next-step").hidden = !words.next_step;
  $("#next-step").replaceChildren(...(words.next_step ? [el("strong", {text: "What to do next: "}), words.next_step] : []));
  box.dataset.codes = (c ? c.why : []).map((r) => r.code).join(" ");  // the headline words them
  $("#decision-support").textContent = words.statement;
  $("#conclusion-detail").textContent = c ? [c.rule, ...c.why.map(reasonDetail),
    ...Object.values(words.cells)].filter(Boolean).join("\n") : "";
  box.scrollIntoView({block: "nearest"});
}

// After the first answer, each match's full image, a few requests at a time so the case's
// own traffic goes first; kept by its content hash, so a cell met again is not fetched.
const IMAGES_AT_ONCE = 3;

async function fetchLargerImages() {
  const started = performance.now();
  const tiles = [...document.querySelectorAll(".match[data-sha]")];
  const progress = $("#images-progress");
  const total = tiles.length;
  let done = 0;
  const show = () => {
    progress.hidden = total === 0;
    progress.value = done;
    progress.max = Math.max(total, 1);
    $("#images-text").textContent = done < total ? `Full-size images: ${done} of ${total} loaded; the small ones are shown until then`
      : `Full-size images: all ${total} loaded`;
    $("#images-line").hidden = total === 0;
  };
  show();
  const next = async () => {
    for (let tile = tiles.shift(); tile; tile = tiles.shift()) {
      try {
        const site = tile.closest(".site-row").dataset.site;
        tile.querySelector("img").src = await fullImage(site, matchOf(tile));
        tile.classList.add("full");
      } catch (err) { /* the thumbnail stays */ }
      done += 1;
      show();
    }
  };
  await Promise.all(Array.from({length: IMAGES_AT_ONCE}, next));
  document.body.dataset.largerImagesS = ((performance.now() - started) / 1000).toFixed(3);
}

function matchOf(tile) {
  const site = tile.closest(".site-row").dataset.site;
  const cellId = tile.closest(".cell-card").dataset.cell;
  const event = state.report.sites.get(site);
  const cell = event.cells.find((c) => c.query_cell_id === cellId);
  return cell.matches.find((m) => m.image_sha256 === tile.dataset.sha);
}

async function fullImage(site, match) {
  if (state.images.has(match.image_sha256)) return state.images.get(match.image_sha256);
  const response = await fetch(`/api/image?site=${encodeURIComponent(site)}&cell_id=${
    encodeURIComponent(match.cell_id)}&sha=${encodeURIComponent(match.image_sha256)}`);
  if (!response.ok) throw new Error((await response.json().catch(() => ({}))).error || `HTTP ${response.status}`);
  const url = URL.createObjectURL(await response.blob());
  state.images.set(match.image_sha256, url);
  return url;
}

// ---------------------------------------------------------------- case report

// A file's bytes as a data: URL, so the report shows the test cells on its own.
const dataURL = (file) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = () => reject(reader.error);
  reader.readAsDataURL(file);
});

const escapeHTML = (text) => String(text).replace(/[&<>"']/g, (c) =>
  ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);

// The report's own styles (it is opened from a file, away from the gateway): compact on
// screen, and on paper each cell kept on one page, colours printed, nothing interactive.
const REPORT_STYLE = `
body { font-family: system-ui, "DejaVu Sans", sans-serif; color: #1d2330; margin: 1.5rem; font-size: 11pt; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; } h2 { font-size: 1.1rem; margin: 0 0 .4rem; }
table { border-collapse: collapse; margin: .4rem 0 1rem; } th, td { border: 1px solid #c8cdd6; padding: .2rem .5rem; text-align: left; }
.meta td:first-child { font-weight: 600; }
.cell { border: 1px solid #c8cdd6; border-radius: 6px; padding: .6rem; margin-bottom: .8rem; break-inside: avoid; page-break-inside: avoid; }
.cell-top { display: flex; gap: 1rem; align-items: center; }
.query { width: 160px; height: 160px; object-fit: cover; border: 2px solid #1d2330; border-radius: 4px; }
.row { display: flex; gap: .4rem; align-items: flex-start; margin-top: .4rem; }
.row-site { width: 6rem; font-weight: 600; }
figure { margin: 0; width: 124px; font-size: 8pt; text-align: center; }
figure img { width: 116px; height: 116px; object-fit: cover; border-radius: 3px; }
.vote { font-weight: 700; } .error { color: #a3123a; }
.conclusion { border: 2px solid #1d2330; border-radius: 6px; padding: .6rem; margin-bottom: 1rem; break-inside: avoid; }
.conclusion-text { font-size: 1.15rem; font-weight: 700; } .decision-support { font-style: italic; }
.db-note { color: #8a4b00; } .spread { color: #4a5363; font-size: 9pt; }
@media (max-width: 600px) { body { margin: .6rem; } .row { flex-wrap: wrap; } .row-site { width: 100%; } figure { width: 104px; } figure img { width: 100px; height: 100px; } }
@media print {
  body { margin: 0; font-size: 10pt; }
  .cell { border-color: #888; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  @page { size: A4; margin: 12mm; }
}`;

async function reportHTML() {
  const r = state.report;
  const s = r.summary;
  const e = escapeHTML;
  const queries = new Map();
  for (const cell of state.pairing.cells) {
    if (r.cells.includes(cell.cell_id)) queries.set(cell.cell_id, await dataURL(state.files.get(cell.image)));
  }
  const c = s.conclusion;
  const terms = new Map((c ? c.cells : []).map((x) => [x.query_cell_id, x]));
  const title = r.accession ? `Case ${r.accession}` : "Case report";
  const siteRows = [...r.sites.values()].map((site) => `<tr><td>${e(site.site)}</td><td>${
    site.ok ? "answered" : e(site.status_words)}</td><td>${e(seconds(site.timing.total_s))}</td></tr>`).join("");
  const cells = r.cells.map((id) => {
    const v = terms.get(id);
    const rows = [...r.sites.values()].map((site) => {
      const cell = site.cells.find((c) => c.query_cell_id === id);
      const body = !site.ok ? `<span class="error">${e(site.status_words)}: no matches</span>`
        : cell && cell.error ? `<span class="error">${e(cell.error)}</span>`
        : (cell ? cell.matches : []).map((m, i) => `<figure><img src="${e(m.thumbnail)}" alt="match ${i + 1} from ${e(site.site)}"><figcaption>${
            e(fullName(m.diagnosis))}${m.bethesda ? ` (${e(m.bethesda)})` : ""}<br>${e(similarityText(m))}${
            measureSummary(m.measures).far.length ? `<br>${e(measureWords(measureSummary(m.measures).far[0], true))}` : ""}</figcaption></figure>`).join("");
      const note = databaseNote(state.siteInfo.get(site.site));
      return `<div class="row" data-site="${e(site.site)}"><div class="row-site">${e(site.site)}${
        note ? `<br><small class="db-note">${e(note)}</small>` : ""}</div>${body}</div>`;
    }).join("");
    return `<section class="cell" data-cell="${e(id)}"><div class="cell-top"><img class="query" src="${
      e(queries.get(id) || "")}" alt="test cell ${e(id)}"><div><h2>${e(id)}</h2>${
      v ? `<p class="vote" data-term="${e(v.bethesda)}">${e(v.bethesda || "no term")} (${v.support} of ${v.total} matches)</p><p class="spread">${
        v.spread.map((t) => `${e(t.bethesda)} ${t.count}`).join(" · ")}</p>` : ""}</div></div>${rows}</section>`;
  }).join("");
  const rejected = r.rejected.length ? `<h2>Not analysed</h2><ul>${
    r.rejected.map((x) => `<li>${e(x.name)}: ${e(x.problem)}</li>`).join("")}</ul>` : "";
  return `<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>${e(title)} · PathMaster report</title>
<style>${REPORT_STYLE}</style></head><body>
<h1>${e(title)}: similar cells from every site</h1>
<section class="conclusion" data-outcome="${e(c && c.outcome ? c.outcome : "no_answer")}" data-codes="${
  e((c ? c.why : []).map((r) => r.code).join(" "))}"><h2>Case conclusion</h2>
<p class="conclusion-text">${e(sentence(s.conclusion_words.headline))}</p>${
  s.conclusion_words.next_step ? `<p class="next-step"><strong>What to do next:</strong> ${e(s.conclusion_words.next_step)}</p>` : ""}
<p class="decision-support">${e(s.conclusion_words.statement)}</p></section>
<table class="meta"><tbody>
<tr><td>Accession number</td><td>${e(r.accession || "(none given)")}</td></tr>
<tr><td>Kind of case</td><td>${e(r.kind)}</td></tr>
<tr><td>Sent by</td><td>${e(r.user)}</td></tr>
<tr><td>Sent at</td><td>${e(isoTime(r.started))}</td></tr>
<tr><td>PathMaster reference</td><td><small>${e(s.case_id)}</small></td></tr>
<tr><td>Time taken</td><td>${e(seconds(r.waited_s || s.total_s))} from sending to the last answer${r.predicted_s ? ` (expected about ${e(seconds(r.predicted_s))})` : ""}</td></tr>
</tbody></table>
<table class="sites"><thead><tr><th scope="col">Site</th><th scope="col">Answer</th><th scope="col">Time</th></tr></thead><tbody>${siteRows}</tbody></table>
<p>“% similar”: the match is closer to the test cell than that share of pairs of cells in its site's own database; it can be compared between sites and cases.</p>
${cells}${rejected}
</body></html>`;
}

// Saves the report as an HTML file the user can open, print or attach to the case.
async function exportReport() {
  const html = await reportHTML();
  const name = (state.report.accession || state.report.summary.case_id).replace(/[^A-Za-z0-9._-]/g, "_");
  if (state.reportURL) URL.revokeObjectURL(state.reportURL);  // the previous report's, long saved
  state.reportURL = URL.createObjectURL(new Blob([html], {type: "text/html"}));
  const link = el("a", {href: state.reportURL, download: `pathmaster-report-${name}.html`});
  document.body.append(link);
  link.click();
  link.remove();
}

// ---------------------------------------------------------------- enlarge

// The test cell and a match side by side at the same pixel scale (the larger of the two
// fills its frame, the other keeps its size relative to it), with a scale bar; the arrow
// keys step through the site's matches for that cell.
const VIEWER_FRAME_PX = () => Math.min(360, Math.floor(window.innerWidth * (window.innerWidth < 600 ? 0.7 : 0.38)));

function openViewer(queryId, site, matches, index) {
  state.viewer = {queryId, site, matches, index};
  const dialog = $("#viewer");
  if (!dialog.open) dialog.showModal();
  showViewerMatch();
}

async function showViewerMatch() {
  const {queryId, site, matches, index} = state.viewer;
  const match = matches[index];
  $("#viewer-title").replaceChildren(`${queryId} beside match ${index + 1} of ${matches.length} from ${site}: `,
    diagnosisBadge(match.diagnosis));
  $("#viewer-query-caption").textContent = `Test cell ${queryId}`;
  $("#viewer-caption").textContent = `${fullName(match.diagnosis)}${match.bethesda ? ` (${match.bethesda})` : ""}` +
    ` · ${similarityText(match)} · ${site}`;
  $("#viewer-caption").title = `${similarityTitle(site, match)} · ${match.source_id}`;
  const {far, close} = measureSummary(match.measures);
  $("#viewer-measures").replaceChildren(
    ...far.map((m) => el("li", {class: "measure far", "data-concept": m.concept},
      el("strong", {text: "Differs: "}), measureWords(m, true, true))),
    ...(close ? [el("li", {class: "measure close", "data-concept": close.concept},
      el("strong", {text: "Close: "}), measureWords(close))] : []));
  $("#viewer-prev").disabled = index === 0;
  $("#viewer-next").disabled = index === matches.length - 1;
  const error = $("#viewer-error");
  error.hidden = true;
  const query = $("#viewer-query");
  const img = $("#viewer-match");
  query.src = state.previews.get(queryId) || "";
  img.src = state.images.get(match.image_sha256) || match.thumbnail;
  delete img.dataset.full;
  try {
    img.src = await fullImage(site, match);
    img.dataset.full = "1";
  } catch (err) {
    error.textContent = `Full image unavailable: ${err.message}; shown from its thumbnail, not to scale.`;
    error.hidden = false;
  }
  await Promise.all([query, img].map((i) => i.decode().catch(() => null)));
  sameScale(query, img, !error.hidden, state.siteInfo.get(site)?.pixel_um || null, site);
}

// Both images at one zoom (CSS px per image px). The scale bar is a round number of
// micrometres where the match's site records its pixel size (`pixelUm`, micrometres per
// image pixel; the test cell is drawn at the same pixel scale), of image pixels where not.
function sameScale(query, match, thumbnailOnly, pixelUm = null, site = "") {
  const frame = VIEWER_FRAME_PX();
  const sizes = [query, match].map((i) => [i.naturalWidth || 1, i.naturalHeight || 1]);
  const zoom = frame / Math.max(...sizes.flat());
  for (const [i, [w, h]] of [query, match].map((im, k) => [im, sizes[k]])) {
    i.style.width = `${Math.round(w * zoom)}px`;
    i.style.height = `${Math.round(h * zoom)}px`;
    i.dataset.zoom = zoom.toFixed(4);
  }
  for (const f of document.querySelectorAll(".viewer-frame")) {
    f.style.width = f.style.height = `${frame}px`;
  }
  const bar = $("#scale-bar");
  const round = (steps, perStep) => steps.find((n) => n * perStep >= frame / 5) || steps[steps.length - 1];
  if (pixelUm && !thumbnailOnly) {
    const um = round([1, 2, 5, 10, 20, 50, 100, 200], zoom / pixelUm);
    $("#scale-line").style.width = `${Math.round(um / pixelUm * zoom)}px`;
    $("#scale-text").textContent = `${um} µm`;
    bar.title = `${site} records ${pixelUm} µm per pixel; the test cell is drawn at the same pixel scale`;
    bar.dataset.um = um;
    bar.dataset.pixels = um / pixelUm;
  } else {
    const pixels = round([5, 10, 20, 50, 100, 200, 500], zoom);
    $("#scale-line").style.width = `${Math.round(pixels * zoom)}px`;
    $("#scale-text").textContent = thumbnailOnly ? "match not to scale"
      : `${pixels} image pixels (pixel scale only: ${site || "the site"} does not record its pixel size)`;
    bar.title = "";
    delete bar.dataset.um;
    bar.dataset.pixels = pixels;
  }
  bar.dataset.pixelUm = pixelUm || "";
  bar.dataset.zoom = zoom.toFixed(4);
}

// "More like this": the match shown becomes the query of a new case, answered by every site.
async function refineByExample() {
  const {site, matches, index} = state.viewer;
  const match = matches[index];
  $("#viewer").close();
  const cellId = `like-${match.cell_id.slice(0, 24)}`;
  state.refined = [];  // a new question by example, not a re-ranking of the last answer
  state.previews.set(cellId, await fullImage(site, match).catch(() => match.thumbnail));
  const cls = chosenClass();
  state.running = true;
  $("#cells").replaceChildren();
  $("#site-cards").replaceChildren();
  $("#conclusion").hidden = true;
  state.started = performance.now();
  state.report = {accession: accession().sent, kind: classLabel(cls), user: $("#who-name").textContent,
                  started: new Date(), predicted_s: null, cells: [], rejected: [], sites: new Map(),
                  summary: null, example: {site, cell_id: match.cell_id}};
  setStatus(`More like match ${index + 1} from ${site}: sending it as a new case…`);
  state.timer = setInterval(tick, 200);
  try {
    const response = await fetch("/api/refine", {method: "POST", headers: csrfHeaders({"Content-Type": "application/json"}),
      body: JSON.stringify({site, cell_id: match.cell_id, request_class: cls, case_id: accession().sent})});
    if (!response.ok) throw wordsError(await response.json().catch(() => ({})), `HTTP ${response.status}`);
    state.finished = false;
    await readEvents(response, handleEvent);
  } catch (err) {
    setStatus(`The case could not be run: ${err.message}`, "error");
  } finally {
    clearInterval(state.timer);
    state.running = false;
    document.body.dataset.caseDone = String(Date.now());
  }
}

function stepViewer(delta) {
  const v = state.viewer;
  if (!v) return;
  const next = v.index + delta;
  if (next < 0 || next >= v.matches.length) return;
  v.index = next;
  showViewerMatch();
}

// ---------------------------------------------------------------- wiring

function wire() {
  const zone = $("#dropzone");
  const input = $("#file-input");
  zone.addEventListener("click", () => input.click());
  zone.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); input.click(); }
  });
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    addFiles(e.dataTransfer.files);
  });
  input.addEventListener("change", () => { addFiles(input.files); input.value = ""; });
  $("#submit").addEventListener("click", () => submitCase());
  $("#refine-concepts").replaceChildren(...CONCEPT_LABELS.map(([concept, label]) =>
    el("label", {class: "refine-concept"}, el("span", {text: label}),
      el("select", {"data-concept": concept},
        ...WEIGHT_CHOICES.map(([w, words]) => el("option", {value: w, selected: w === 1, text: words}))))));
  $("#refine-run").addEventListener("click", () => {
    const weights = {};
    for (const select of document.querySelectorAll("#refine-concepts select")) {
      if (Number(select.value) !== 1) weights[select.dataset.concept] = Number(select.value);
    }
    submitCase(weights);
  });
  $("#clear").addEventListener("click", clearCase);
  $("#export").addEventListener("click", exportReport);
  $("#viewer").addEventListener("close", () => { state.viewer = null; });
  $("#viewer").addEventListener("keydown", (e) => {
    if (e.key === "ArrowRight") { e.preventDefault(); stepViewer(1); }
    if (e.key === "ArrowLeft") { e.preventDefault(); stepViewer(-1); }
  });
  $("#viewer-prev").addEventListener("click", () => stepViewer(-1));
  $("#viewer-next").addEventListener("click", () => stepViewer(1));
  $("#viewer-refine").addEventListener("click", refineByExample);
  $("#accession").addEventListener("input", showAccession);
}

async function start() {
  wire();
  $("#login-form").addEventListener("submit", signIn);
  $("#logout").addEventListener("click", signOut);
  try {
    const session = await getJSON("/api/session");
    state.csrf = session.csrf;
    $("#who-name").textContent = `${session.user} (${session.role})`;
    $("#who").hidden = false;
    $("#app").hidden = false;
  } catch (err) {
    if (!(err instanceof SignedOut)) setStatus(`The gateway is not answering: ${err.message}`, "error");
    return;
  }
  try {
    await loadConfig();
  } catch (err) {
    setStatus(`The gateway is not answering: ${err.message}`, "error");
    return;
  }
  await Promise.all([loadSites(), loadStats()]);
  document.body.dataset.ready = "1";
}

start();
