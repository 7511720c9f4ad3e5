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
// each as the match's value over the test cell's ("ratio"; null where the site could not
// compare the two values, e.g. one cell segmented wrongly) and its share of the distance.
const MEASURE_WORDS = {  // [what, higher, lower, same, the concept as a noun (what differs)]
  nucleus_size: ["nucleus", "larger", "smaller", "the same size", "nucleus size"],
  nc_ratio: ["N/C ratio", "higher", "lower", "alike", "N/C ratio"],
  chromatin: ["chromatin", "darker", "lighter", "alike", "chromatin texture"],
  nucleus_shape: ["nucleus", "rounder", "more irregular", "alike in shape", "nucleus shape"],
  cytoplasm: ["cell", "larger", "smaller", "the same size", "cytoplasm"],
};
const ALIKE = (m) => m.ratio !== null && m.ratio >= 0.9 && m.ratio <= 1.1;  // the shown values within 10%
const RATIO_CAP = 3;  // a ratio beyond it is said as "more than 3x": its digits mean nothing more

// A measure in words ("nucleus 1.9x larger", "nucleus more than 3x larger"). One that counts
// in the distance though its shown value is alike, or cannot be compared, is named by its
// concept: "chromatin texture differs" (`far`), or "chromatin texture" beside a "Differs:"
// label (`labelled`).
function measureWords(m, far = false, labelled = false) {
  const name = m.concept.replaceAll("_", " ");
  const [what, up, down, same, noun] = MEASURE_WORDS[m.concept] || [name, "higher", "lower", "alike", name];
  if (m.ratio === null || ALIKE(m)) return !far ? `${what} ${same}` : labelled ? noun : `${noun} differs`;
  const times = Math.max(m.ratio, 1 / m.ratio);
  const amount = times > RATIO_CAP ? `more than ${RATIO_CAP}x` : `${times.toFixed(1)}x`;
  return `${what} ${amount} ${m.ratio > 1 ? up : down}`;
}

// The (up to two) concepts that keep a match farthest, and one that is alike and counts
// least (null when none is alike).
function measureSummary(measures) {
  if (!measures || !measures.length) return {far: [], close: null};
  const far = measures.slice(0, 2).filter((m) => m.share >= 0.2);
  const close = [...measures].reverse().find((m) => ALIKE(m) && !far.includes(m)) || null;
  return {far, close};
}

// A match's similarity (services/site/explain.py: below 1 for any cell but the test cell
// itself), rounded down so that only the same cell reads "100%".
const similarityText = (m) => m.same_cell ? "same cell (100%)"
  : m.similarity < 0.01 ? "<1% similar" : `${Math.floor(100 * m.similarity)}% similar`;
const similarityTitle = (site, m) => (m.same_cell ? `this is the test cell itself, in ${site}'s database; ` : "") +
  `closer than the nearest neighbour of ${Math.floor(100 * m.similarity)}% of the cells in ${site}'s own ` +
  `database (distance ${m.distance.toFixed(3)} in ${site}'s own measure)`;

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

// Refining by concept (the sites re-rank: services/shared.py CONCEPTS): the concepts offered and
// the weights a pathologist chooses between.
const CONCEPT_LABELS = [["nucleus_size", "Nucleus size"], ["nc_ratio", "N/C ratio"], ["chromatin", "Chromatin"],
                        ["nucleus_shape", "Nucleus shape"], ["cytoplasm", "Cytoplasm"]];
const WEIGHT_CHOICES = [[0, "ignore"], [0.5, "less"], [1, "as usual"], [2, "more"], [4, "much more"]];
