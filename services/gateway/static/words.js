// What the page says in a pathologist's words beside what the gateway words for it (the
// conclusion and reason codes): a match's measures, its similarity, a site's database.
// Loaded before app.js.
"use strict";

// A Bethesda term's severity band for its colour (0 NILM .. 4 carcinoma), from the terms in
// order of severity that the gateway sends (GET /api/config: pathmaster.vocabulary's order).
const bethesdaLevel = (term) => {
  const order = (state.config?.bethesda_terms || []).map((t) => t.toUpperCase());
  const i = order.indexOf(String(term || "").toUpperCase());
  return i < 0 ? "unknown" : i === 0 ? 0 : Math.min(4, 1 + Math.floor((i - 1) / 2));
};

// Reason codes arrive with their words from the gateway (services/reasons.py): "plain" for
// the pathologist ("" when they need not read it), "full" for the researcher.
const reasonWords = (reason) => reason.plain ?? reason.code.replaceAll("_", " ");
const reasonDetail = (reason) => `${reason.code}: ${reason.full || ""}`;
const plainReasons = (whys) => (whys || []).filter((r) => reasonWords(r));

// A match's measures (services/site/explain.py): how the match compares with the test cell,
// each as the match's value over the test cell's ("ratio") and its share of the distance.
const MEASURE_WORDS = {  // [what, higher, lower, same, differs (in what the shown value misses)]
  nucleus_size: ["nucleus", "larger", "smaller", "the same size", "nucleus size differs"],
  nc_ratio: ["N/C ratio", "higher", "lower", "alike", "N/C ratio differs"],
  chromatin: ["chromatin", "darker", "lighter", "alike", "chromatin texture differs"],
  nucleus_shape: ["nucleus", "rounder", "more irregular", "alike in shape", "nucleus shape differs"],
  cytoplasm: ["cell", "larger", "smaller", "the same size", "cytoplasm differs"],
};
const ALIKE = (m) => m.ratio >= 0.9 && m.ratio <= 1.1;  // the shown values within 10%

// A measure in words ("nucleus 1.9x larger"); one that counts in the distance though its
// shown value is alike says the concept differs (its other features do).
function measureWords(m, far = false) {
  const [what, up, down, same, differs] = MEASURE_WORDS[m.concept] ||
    [m.concept.replaceAll("_", " "), "higher", "lower", "alike", `${m.concept.replaceAll("_", " ")} differs`];
  if (ALIKE(m)) return far ? differs : `${what} ${same}`;
  return m.ratio > 1 ? `${what} ${m.ratio.toFixed(1)}x ${up}` : `${what} ${(1 / m.ratio).toFixed(1)}x ${down}`;
}

// The (up to two) concepts that keep a match farthest, and one that is alike and counts
// least (null when none is alike).
function measureSummary(measures) {
  if (!measures || !measures.length) return {far: [], close: null};
  const far = measures.slice(0, 2).filter((m) => m.share >= 0.2);
  const close = [...measures].reverse().find((m) => ALIKE(m) && !far.includes(m)) || null;
  return {far, close};
}

const similarityText = (m) => m.similarity < 0.005 ? "<1% similar" : `${Math.round(100 * m.similarity)}% similar`;
const similarityTitle = (site, m) =>
  `closer than ${Math.round(100 * m.similarity)}% of pairs of cells in ${site}'s own database ` +
  `(distance ${m.distance.toFixed(3)} in ${site}'s own measure)`;

// A site's database as the pathologist should weigh it: synthetic or small, said beside its matches.
const SMALL_DATABASE = 500;
function databaseNote(info) {
  if (!info) return "";
  const synthetic = (info.database_origins || {}).synthetic || 0;
  const n = info.database_cells;
  const notes = [synthetic === n ? `synthetic database of ${n} cells`
    : synthetic ? `${synthetic} of its ${n} cells synthetic` : ""];
  if (n < SMALL_DATABASE && synthetic !== n) notes.push(`only ${n} cells`);
  return notes.filter(Boolean).join(", ");
}

// Refining by concept (the sites re-rank: services/site/explain.py): the concepts offered and
// the weights a pathologist chooses between.
const CONCEPT_LABELS = [["nucleus_size", "Nucleus size"], ["nc_ratio", "N/C ratio"], ["chromatin", "Chromatin"],
                        ["nucleus_shape", "Nucleus shape"], ["cytoplasm", "Cytoplasm"]];
const WEIGHT_CHOICES = [[0, "ignore"], [0.5, "less"], [1, "as usual"], [2, "more"], [4, "much more"]];
