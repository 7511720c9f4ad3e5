// What the page says in a pathologist's words: the case conclusion, a match's measures,
// its similarity, and the coordinator's decisions (reason codes). Loaded before app.js.
"use strict";

// Every result is decision support; said wherever a conclusion is shown or saved.
const DECISION_SUPPORT =
  "Decision support, not a diagnosis: the closest database cells and the terms they carry, " +
  "for the cells sent. The pathologist makes the diagnosis from the slide.";

// The Bethesda terms, least to most severe (a cell's spread is shown in this order, worst first).
const BETHESDA_ORDER = ["NILM", "ASC-US", "LSIL", "ASC-H", "HSIL", "SCC", "AGC", "AIS", "adenocarcinoma"];
const bethesdaLevel = (term) => {
  const i = BETHESDA_ORDER.indexOf(term);
  return i < 0 ? "unknown" : i === 0 ? 0 : Math.min(4, 1 + Math.floor((i - 1) / 2));
};

// The case's outcome in a sentence (CaseConclusion.outcome).
function conclusionHeadline(c) {
  if (!c) return "No case conclusion from the coordinator.";
  const of = `${c.cells_with} of ${c.cells_total} cell${c.cells_total === 1 ? "" : "s"}`;
  switch (c.outcome) {
    case "abnormal": return `${c.bethesda}: the most significant abnormality, supported by ${of}`;
    case "nilm": return `NILM (no abnormality supported by the matches of ${c.cells_total} cell${c.cells_total === 1 ? "" : "s"})`;
    case "cannot_conclude": return "Cannot conclude: the matches do not agree enough";
    default: return "No answer: no site returned matches for this case";
  }
}

// Words for reason codes; a code without words here is shown as itself (the researcher's
// view lists every code and its values).
const REASON_WORDS = {
  class_stepped_down_within_deadline: (p) =>
    `sent with ${p.served || "a lower"} priority because it will still arrive within the ${p.asked || "asked"} deadline`,
  class_reclassified: (p) => `sent as ${p.served || "another kind"}: the ${p.asked || "asked"} lane was full`,
  hedged: () => "also asked a second time, in case the first answer is slow",
  hedge_planned: () => "will be asked a second time if its answer is slow",
  copies: (p) => `sent ${p.copies || "several"} times over, so one lost packet does not delay it`,
  mode_features: () => "the cells' measurements were sent (smaller than the images)",
  mode_images: () => "the images were sent; the site measures the cells",
  features_fallback_images: () => "the measurements did not suit this site; the images were sent instead",
  sites_disagree: () => "the sites' matches disagree",
  too_few_matches: () => "too few matches carry a Bethesda term",
  synthetic_database: () => "the site's database is synthetic (made-up cells)",
  small_database: (p) => `the site's database is small (${p.cells || "few"} cells)`,
};

function reasonWords(reason) {
  if (reason.words) return reason.words;  // the gateway's words, when it has them
  const words = REASON_WORDS[reason.code];
  return words ? words(reason.params || {}) : reason.code.replaceAll("_", " ");
}

// The researcher's line for a reason: its code and every value.
const reasonDetail = (reason) => `${reason.code}(${Object.entries(reason.params || {})
  .map(([k, v]) => `${k}=${v}`).join(", ")})`;

// A match's measures (services/site/explain.py): how the match compares with the test cell,
// each as the match's value over the test cell's ("ratio") and its share of the distance.
const MEASURE_WORDS = {
  nucleus_size: ["nucleus", "larger", "smaller", "the same size"],
  nc_ratio: ["N/C ratio", "higher", "lower", "alike"],
  chromatin: ["chromatin", "darker", "lighter", "alike"],
  nucleus_shape: ["nucleus", "rounder", "more irregular", "alike in shape"],
  cytoplasm: ["cell", "larger", "smaller", "the same size"],
};

function measureWords(m) {
  const [what, up, down, same] = MEASURE_WORDS[m.concept] || [m.concept.replaceAll("_", " "), "higher", "lower", "alike"];
  if (m.ratio >= 0.9 && m.ratio <= 1.1) return `${what} ${same}`;
  return m.ratio > 1 ? `${what} ${m.ratio.toFixed(1)}x ${up}` : `${what} ${(1 / m.ratio).toFixed(1)}x ${down}`;
}

// The two measures that keep a match farthest and the one that makes it closest.
function measureSummary(measures) {
  if (!measures || !measures.length) return {far: [], close: null};
  const far = measures.slice(0, 2).filter((m) => m.share >= 0.2);
  return {far, close: measures[measures.length - 1]};
}

const similarityText = (m) => `${Math.round(100 * m.similarity)}% similar`;
const similarityTitle = (site, m) =>
  `closer than ${Math.round(100 * m.similarity)}% of pairs of cells in ${site}'s own database ` +
  `(distance ${m.distance.toFixed(3)} in ${site}'s own measure)`;

// A site's database as the pathologist should weigh it: synthetic or small, said beside its matches.
const SMALL_DATABASE = 500;
function databaseNote(info) {
  if (!info) return "";
  const notes = [];
  const origins = info.database_origins || {};
  if (origins.synthetic) notes.push(origins.synthetic === info.database_cells ? "synthetic database"
    : `${origins.synthetic} of its cells synthetic`);
  if (info.database_cells < SMALL_DATABASE) notes.push(`only ${info.database_cells} cells`);
  return notes.join(", ");
}
