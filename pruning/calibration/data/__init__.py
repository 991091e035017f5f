"""Calibration and evaluation data: one spec string per source, resolved to text windows or questions.

* :mod:`.items` — the vocabulary (:class:`DataSpec`, :class:`ChoiceItem`, samples, :class:`Source`);
* :mod:`.sources` — ``SOURCES``, every source by name; one module per source family: :mod:`.hub`,
  :mod:`.commonsense`, :mod:`.pydoc`, :mod:`.demo`, :mod:`.local`;
* :mod:`.specs` — spec strings parsed and resolved to a split's documents or items;
* :mod:`.sampling` — the seeded draw of calibration samples (``documents`` or ``stream``);
* :mod:`.show` — the drawn instances as an objective sees them (``depthprune data show``).

Specs (``SOURCES`` lists them with their kind):

* ``c4``, ``wikitext2``, ``lambada`` — flowing text from the Hugging Face hub through ``datasets``, as the
  pruning literature uses them: C4 ``allenai/c4`` English shards (calibration from the first train shard,
  evaluation from ``en/c4-validation.00000-of-00008.json.gz`` like SparseGPT/SLEB), WikiText-2
  ``wikitext-2-raw-v1`` (train / test), LAMBADA (``cimec/lambada`` validation for calibration,
  ``EleutherAI/lambada_openai`` test for evaluation, the split lm-eval scores).
* ``commonsense170k`` — the LLM-Adapters ``ft-training_set/commonsense_170k.json`` mixture (BoolQ, PIQA,
  SIQA, HellaSwag, WinoGrande, ARC, OBQA) the study calibrates the task margin on. Each row becomes the item
  PuDDing scores: the question, the option *texts* parsed from the instruction, the correct one's index
  (:mod:`.commonsense`). ``commonsense170k:PATH`` (or ``commonsense170k@PATH``) reads a
  local copy of the published file.
* ``demo:text`` / ``demo:qa`` — the held-out splits of the demo model (``data/text_*.jsonl`` and
  ``data/qa_*.jsonl``); ``demo:text@DIR`` names the demo model directory explicitly.
* ``pydoc`` / ``pydoc-cloze`` — real English that installs with Python, offline: the documentation topics
  every CPython ships (``pydoc_data.topics``) as text documents, and LAMBADA-style cloze items built from
  them (passage, its true final word, three distractors from the same split). They alone have a ``heal``
  split besides ``calibration`` and ``test``; topics are split by a stable hash of their name, so the splits
  never overlap. Provenance, deduplication and counts: :mod:`.pydoc`.
* ``text:PATH`` — a local ``.txt`` file (one document per non-blank line) or ``.jsonl`` (one document per
  record, its ``text`` field).
* ``mc:PATH`` — a local JSONL of ``{"context": ..., "choices": [...], "label": i}`` (optionally
  ``"scoring": "sentence"``, see :class:`ChoiceItem`).

Text samples are drawn one document per instance (``documents``) or as windows of the joined text
(``stream``): :mod:`.sampling`.

Splits: ``calibration`` and ``test`` for every source (a local file gives the whole file for either),
``heal`` for ``HEAL_SOURCES`` only.

Offline (no network, as on the machines this repository is tested on), a hub source that cannot be fetched
raises a :class:`UserError` naming the local spec to use instead.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "ANSWER_SCORING",
            "MULTIPLE_CHOICE",
            "SAMPLINGS",
            "SCORINGS",
            "SENTENCE_SCORING",
            "SPLITS",
            "TEXT",
            "ChoiceItem",
            "ChoiceSamples",
            "DataSpec",
            "Source",
            "TextSamples",
        ],
        "pruning.calibration.data.items",
    ),
    "SOURCES": "pruning.calibration.data.sources",
    "HEAL_SOURCES": "pruning.calibration.data.sources",
    "known_specs": "pruning.calibration.data.sources",
    **dict.fromkeys(
        ["parse_spec", "spec_kind", "has_heal_split", "load_documents", "load_choice_items"],
        "pruning.calibration.data.specs",
    ),
    **dict.fromkeys(
        [
            "tokenize_stream",
            "text_windows",
            "sample_documents",
            "sample_stream_windows",
            "sample_text",
            "sample_choices",
            "load_samples",
        ],
        "pruning.calibration.data.sampling",
    ),
    "wikitext_articles": "pruning.calibration.data.hub",
    "read_text_file": "pruning.calibration.data.local",
    "read_choice_file": "pruning.calibration.data.local",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
