// The pathologist's own path to the gateway, as this page measures it: the round trip and
// the download rate of its own requests (the browser's Resource Timing entries), and how
// many bytes a site's answer takes per cell on that path (from the answers read). A site's
// wait is the coordinator's prediction for the site (coordinator to site and back) plus
// this link's time for the answer: one number per site, shown once. Loaded before app.js.
"use strict";

const ANSWER_BYTES_GUESS = 9000;  // one cell's answer from one site (5 matches with thumbnails) until one is read
const RATE_MIN_BYTES = 16_000;    // responses smaller than this time the round trip, not the rate
const RECENT_ENTRIES = 40;        // the most recent requests the link is judged by

const ANSWER_RATE_MIN_BYTES = 4000;  // an answer smaller than this times the sites, not the link
const RECENT_CASES = 5;  // the page's own cases whose unforeseen remainder it adds to the next
const LINK_KEY = "pathmaster-link";  // localStorage: what this browser learnt of its path (numbers only)
const link = {answerBytesPerCell: new Map(),  // site -> bytes per cell of its last answer
              answerRates: [],                // bytes per second of the recent answers' own last stretch
              remainders: []};                // seconds the recent cases took beyond what was foreseen

// What an earlier page in this browser learnt of the path, so a reload starts from it.
try {
  const kept = JSON.parse(localStorage.getItem(LINK_KEY) || "{}");
  link.answerBytesPerCell = new Map(Object.entries(kept.answerBytesPerCell || {}));
  link.answerRates = (kept.answerRates || []).filter(Number.isFinite);
  link.remainders = (kept.remainders || []).filter(Number.isFinite);
} catch { /* nothing kept, or storage refused: learnt afresh */ }

function keepLink() {
  try {
    localStorage.setItem(LINK_KEY, JSON.stringify({answerBytesPerCell: Object.fromEntries(link.answerBytesPerCell),
                                                   answerRates: link.answerRates, remainders: link.remainders}));
  } catch { /* storage refused: learnt again next time */ }
}

// {rtt_s, bytes_per_s} of the page's link to the gateway: the quickest of its recent small
// requests, start to end (a round trip and little work), and the median rate of its larger
// downloads' bodies, first byte to last (so not the gateway's time to make them; the
// case's own stream is left out: it waits for the sites), with the sites' answers' own
// (noteAnswer). Null parts where nothing is measured yet.
function linkNow() {
  const entries = performance.getEntriesByType("resource")
    .filter((e) => e.name.startsWith(location.origin) && e.duration > 0 && !e.name.includes("/api/case"))
    .slice(-RECENT_ENTRIES);
  const small = entries.filter((e) => e.encodedBodySize < RATE_MIN_BYTES).map((e) => e.duration / 1000);
  const rates = entries.filter((e) => e.encodedBodySize >= RATE_MIN_BYTES && e.responseEnd > e.responseStart)
    .map((e) => e.encodedBodySize / ((e.responseEnd - e.responseStart) / 1000))
    .concat(link.answerRates).sort((a, b) => a - b);
  return {rtt_s: small.length ? Math.min(...small) : null,
          bytes_per_s: rates.length ? rates[Math.floor(rates.length / 2)] : null};
}

// Seconds this link takes to bring `bytes` to the page after asking: a round trip and the
// bytes at its rate (0 for what is not measured).
function linkSeconds(bytes) {
  const {rtt_s, bytes_per_s} = linkNow();
  return (rtt_s || 0) + (bytes_per_s ? bytes / bytes_per_s : 0);
}

// A site's answer as it reached the page: `bytes` of it for `cells` cells, `beyond_s`
// seconds after the plan reached the page beyond the coordinator's own time for the site
// (both left the coordinator down the same link: the answer's bytes took that long more).
function noteAnswer(site, bytes, cells, beyond_s) {
  if (cells > 0) link.answerBytesPerCell.set(site, bytes / cells);
  if (bytes >= ANSWER_RATE_MIN_BYTES && beyond_s > 0) {
    link.answerRates = [...link.answerRates, bytes / beyond_s].slice(-RECENT_ENTRIES);
  }
  keepLink();
}

// The bytes one cell's answer takes from `site` (null: from the largest answer seen).
const answerBytes = (site = null) => link.answerBytesPerCell.get(site) ??
  (link.answerBytesPerCell.size ? Math.max(...link.answerBytesPerCell.values()) : ANSWER_BYTES_GUESS);

// What the page's recent cases took beyond their foreseen wait (the gateway's own work, the
// coordinator's before it plans ...): the median of the last RECENT_CASES, 0 before any.
function pathRemainder() {
  const sorted = [...link.remainders].sort((a, b) => a - b);
  return sorted.length ? Math.max(0, sorted[Math.floor(sorted.length / 2)]) : 0;
}

// A case answered `waited_s` after the click, foreseen at `foreseen_s` without the remainder.
function noteCaseWait(foreseen_s, waited_s) {
  if (foreseen_s > 0 && waited_s > 0) link.remainders = [...link.remainders, waited_s - foreseen_s].slice(-RECENT_CASES);
  keepLink();
}

// The wait for `site` to answer `cells` cells, from the click: the coordinator's
// `predicted_s` for it, this link's time for its answer and what the page's own recent
// cases took beyond that. Null without a prediction.
function siteWait(site, predicted_s, cells) {
  if (!predicted_s) return null;
  return predicted_s + linkSeconds(cells * answerBytes(site)) + pathRemainder();
}
