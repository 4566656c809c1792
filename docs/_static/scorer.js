// lmgeom's search ranking: the user pages (Getting started, Tour, Methods, ...) before the API
// reference, whose many modules would otherwise bury them (searching "dispersion" listed
// lmgeom.metrics.dispersion and internal modules first). Same weights as Sphinx's default
// Scorer; only score() is added.
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    return docname.startsWith("api/") ? score - 30 : score;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
