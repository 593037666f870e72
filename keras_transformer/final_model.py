"""The final model of a training workdir: the model rebuilt from its config with the average of
its last checkpoints, or the candidate that the dev set chooses.

What `train` does after training and what `keras-transformer export` does on a workdir are the
same, so both call `final_model`, with a `Plan` each resolves from its config at its start:

- `export.average_checkpoints: N` and a numeric `decode.alpha`: the average of the last N
  complete checkpoints (the paper's final models), decoded with that alpha;
- `export.average_checkpoints: auto` and/or `decode.alpha: auto` (or `export --select-on-dev`):
  the dev set chooses. The candidates are the last checkpoint, the averages of the last 2, 3 and
  `train.keep_checkpoints` complete checkpoints, and with `train.keep_best: K` the best-scored
  checkpoint of `WORKDIR/best/` and the average of those K; each with every alpha of
  `ALPHA_CANDIDATES` (or the fixed one). Each is decoded with the export's beam on the first
  `export.select_max_sentences` dev sentences (1,000 by default: on 300, candidates 0.04 apart
  came out in the wrong order on the whole dev set); the best dev sacreBLEU wins and a tie (the same
  figure to sacreBLEU's two decimals) keeps the simpler candidate: fewer checkpoints, then the
  paper's alpha, then the last checkpoints over the kept best. The same workdir always chooses
  the same candidate.

A vocabulary shortlist's lexical table (`final_model(..., shortlist=table)`: the export's, as
`train` passes it) makes every candidate decode over it, as the export will.

OpenNMT-tf (`export_on_best`), Marian (`--keep-best`) and fairseq (`checkpoint_best.pt`) let the
validation set choose in the same way.
"""

import dataclasses
import hashlib
import json
import time

from keras_transformer.config import AUTO, DecodingSettings
from keras_transformer.errors import UsageError
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.models import build_transformer
from keras_transformer.workdir import (
    average_checkpoints,
    complete_checkpoints,
    join,
    load_model_weights,
    read_text,
    write_atomically,
)

PAPER_ALPHA = DecodingSettings.alpha
# The length penalties tried by `decode.alpha: auto`: the paper's and 1.0 (which small models
# on short budgets preferred; docs/history.md).
ALPHA_CANDIDATES = (PAPER_ALPHA, 1.0)
BEST_SCORES = "scores.json"  # in WORKDIR/best: {"scores": {step: dev BLEU}, "kept": [steps]}
KEPT_FIGURES = "final.partial.json"  # in WORKDIR: see `KeptFigures`
PHASE = "the final model's choice on the dev set"  # what `stopping.check` names


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to make the final model: the checkpoints averaged and the length penalty.

    Args:
        checkpoints: `((step, path), ...)`, oldest first (one: that checkpoint alone).
        alpha: the length-penalty exponent.
        kind: "last" (the last checkpoints of `checkpoints/`) or "best" (of `best/`).
    """

    checkpoints: tuple
    alpha: float
    kind: str = "last"

    @property
    def steps(self):
        return [step for step, _ in self.checkpoints]

    def simplicity(self):
        """Sorts the simpler first: fewer checkpoints, the paper's alpha, the last ones."""
        return (len(self.checkpoints), self.alpha != PAPER_ALPHA, self.kind != "last")

    def describe(self):
        steps = self.steps
        if len(steps) == 1:
            what = f"step {steps[0]}" + (" (best dev)" if self.kind == "best" else "")
        else:
            what = f"average of the {self.kind} {len(steps)} (steps {', '.join(map(str, steps))})"
        return f"{what}, alpha {self.alpha:g}"


@dataclasses.dataclass
class FinalModel:
    """The model to score and export, and how it was made.

    Attributes:
        model: a float32 Keras model outside any distribution strategy.
        steps: the checkpoint steps averaged into it.
        alpha: the length penalty chosen on dev; None: the export settings' (`Plan.settings`).
        selection: the dev-set choice (`to_json()` goes to `result.json`), or None.
        dev_scores: `(settings, sentences, scores, shortlist)`: the chosen candidate's dev
            figures of the choice (`evaluation.score_translations`), decoded with the
            `DecodingSettings` `settings` on the first `sentences` dev pairs over the lexical
            table of `shortlist_key` `shortlist` (None: the whole vocabulary), which the
            scoring reuses where it would decode the same (`reused_dev_scores`); None where
            not decoded in this process.
    """

    model: object
    steps: list
    alpha: float = None
    selection: dict = None
    dev_scores: tuple = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the final model is made: what `final_model` reads of the run's config, resolved
    once at the top (`Plan.of`, in `train` and `keras-transformer export`), so that nothing
    here reads the whole config or makes decoding settings again.

    Attributes:
        model: the `model:` section (the architecture rebuilt).
        data: the `data:` section (the dev set tokenized and decoded as in training).
        export: the `export:` section (`average_checkpoints`, `select_*`).
        settings: the export's `DecodingSettings`: the choice decodes with its search (without
            sampling), at its length penalty unless the dev set chooses one.
        chooses_alpha: the dev set chooses the length penalty (`decode.alpha: auto`, no
            `export.alpha`).
        keep_checkpoints: `train.keep_checkpoints` (the longest average `auto` tries).
        keep_best: `train.keep_best` (the kept best checkpoints are candidates too).
    """

    model: object
    data: object
    export: object
    settings: DecodingSettings
    chooses_alpha: bool
    keep_checkpoints: int
    keep_best: int = 0

    @classmethod
    def of(cls, config, settings):
        """The plan of the `ExperimentConfig` `config`, whose export's `DecodingSettings` are
        `settings` (`config.decoding_settings(config, export=True)`)."""
        return cls(
            config.model,
            config.data,
            config.export,
            settings,
            config.decode.alpha == AUTO and config.export.alpha is None,
            config.train.keep_checkpoints,
            config.train.keep_best,
        )

    @property
    def selects(self):
        """True when the dev set chooses (`auto` averaging or length penalty)."""
        return self.export.average_checkpoints == AUTO or self.chooses_alpha

    def choosing_everything(self):
        """The plan with `auto` averaging and length penalty: every candidate is chosen among
        (what `export --select-on-dev` asks for where the config fixes both). Its settings'
        alpha is the paper's, as `decode.alpha: auto` makes it where nothing fixes one."""
        return dataclasses.replace(
            self,
            export=dataclasses.replace(self.export, average_checkpoints=AUTO),
            settings=dataclasses.replace(self.settings, alpha=PAPER_ALPHA),
            chooses_alpha=True,
        )


def load_checkpoints(model, checkpoints):
    """Loads one checkpoint `[(step, path)]` into `model`, or the average of several."""
    if len(checkpoints) == 1:
        load_model_weights(model, checkpoints[0][1])
    else:
        average_checkpoints(model, [path for _, path in checkpoints])
    return model


def last_checkpoints(layout, count, strict=True):
    """The last `count` complete checkpoints `[(step, path)]` of the workdir `layout`; with
    `strict`, `UsageError` when there are fewer (else as many as there are, at least one)."""
    if not layout.list_checkpoints():
        raise UsageError(f"no checkpoints (ckpt-<step>.weights.h5) in {layout.checkpoints}")
    # Torn or corrupted checkpoints are skipped (one line each): never averaged or exported.
    checkpoints = complete_checkpoints(layout.checkpoints, count)
    if not checkpoints:
        raise UsageError(f"every checkpoint in {layout.checkpoints} is torn or corrupted")
    if strict and count > len(checkpoints):
        raise UsageError(
            f"cannot average {count} checkpoints: {layout.checkpoints} has "
            f"{len(checkpoints)} complete"
        )
    return checkpoints


def read_best(directory):
    """`(scores, kept)` of `directory/scores.json` (`WORKDIR/best`): `{step: dev BLEU}` of every
    step scored and the kept steps, best first; `({}, [])` when there is none."""
    try:
        state = json.loads(read_text(join(directory, BEST_SCORES)))
    except (OSError, ValueError):
        return {}, []
    return {int(k): v for k, v in state["scores"].items()}, [int(s) for s in state["kept"]]


def candidates(plan, layout, alpha=None):
    """The candidates of the dev-set choice for the workdir `layout` (see the module's
    docstring); `alpha` fixes the length penalty (e.g. `export --alpha`)."""
    complete = complete_checkpoints(layout.checkpoints)
    if not complete:
        last_checkpoints(layout, 1)  # raises the line that says why
    count = plan.export.average_checkpoints
    counts = (1, 2, 3, plan.keep_checkpoints) if count == AUTO else (count,)
    sets = []
    for n in sorted(set(counts)):
        if n <= len(complete) or n == counts[0]:
            sets.append((tuple(complete[-n:]), "last"))
    if count == AUTO:
        sets += _best_sets(layout, {tuple(s for s, _ in cps) for cps, _ in sets})
    if alpha is not None:
        alphas = (alpha,)
    elif plan.chooses_alpha:
        alphas = ALPHA_CANDIDATES
    else:
        alphas = (plan.settings.alpha,)
    found = [Candidate(cps, a, kind) for cps, kind in sets for a in alphas]
    return sorted(found, key=Candidate.simplicity)


def _best_sets(layout, known):
    """The `train.keep_best` candidates: the best checkpoint alone and the kept ones averaged,
    where complete and not already among `known` step sets."""
    _, kept = read_best(layout.best)
    complete = dict(complete_checkpoints(layout.best, report=lambda line: None))
    kept = [step for step in kept if step in complete]
    sets = []
    for chosen in (kept[:1], sorted(kept)):
        steps = tuple(chosen)
        if steps and steps not in known:
            known.add(steps)
            sets.append((tuple((s, complete[s]) for s in steps), "best"))
    return sets


class KeptFigures:
    """Figures of `train`'s last phases kept as they come in `WORKDIR/final.partial.json` (the
    dev BLEU of each candidate of the choice; the final model's dev and test scores), so that
    a run stopped there (SIGTERM) does not compute them again: the same command goes on from
    the last one. Each `section` holds the figures of one `key` (what they depend on); another
    key starts it afresh. `train` removes the file once `result.json` is written.

    Args:
        path: the file (any filesystem); None keeps nothing (`export` on a workdir).
    """

    def __init__(self, path):
        self.path = path
        try:
            self.kept = json.loads(read_text(path)) if path else {}
        except (OSError, ValueError):
            self.kept = {}

    def get(self, section, key, name):
        """The figure `name` of `section` computed under `key`, or None."""
        found = self.kept.get(section, {})
        return found.get("figures", {}).get(name) if found.get("key") == key else None

    def put(self, section, key, name, value):
        if not self.path:
            return
        found = self.kept.get(section, {})
        figures = found.get("figures", {}) if found.get("key") == key else {}
        self.kept[section] = {"key": key, "figures": {**figures, name: value}}
        write_atomically(self.path, json.dumps(self.kept, indent=1))


def figures_key(**what):
    """A key of `KeptFigures`: the sha256 of what the figures depend on."""
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def shortlist_key(shortlist):
    """What a `figures_key` holds of the lexical table decoded over: the sha256 of its arrays
    (None: the whole vocabulary)."""
    if shortlist is None:
        return None
    import numpy as np

    digest = hashlib.sha256()
    for array in (shortlist.translations, shortlist.frequent):
        array = np.ascontiguousarray(array, np.int32)
        digest.update(str(array.shape).encode("ascii"))
        digest.update(array.tobytes())
    return digest.hexdigest()


def select_on_dev(model, tokenizer, plan, layout, dev_pairs, alpha=None, report=print, kept=None,
                  deadline=None, after_sentences=0, shortlist=None):  # fmt: skip
    """Chooses the final model on the first `export.select_max_sentences` of `dev_pairs`, loads
    it into `model` and returns the `FinalModel`.

    With `export.select_screen_sentences > 0` and more checkpoint sets than
    `export.select_finalists`, each set is first screened by greedy decoding of the first
    `select_screen_sentences` of those sentences; only the best finalists (greedy BLEU, then
    simplicity) are decoded with the export's beam, each at every alpha, and the best beam BLEU
    wins. Greedy decoding costs a fraction of the beam's and ranks checkpoint sets the same way
    far more often than not; the length penalty, which greedy decoding ignores, is chosen at the
    beam. `deadline` (a `time.perf_counter()` value, e.g. the end of a `train.max_minutes`
    budget) drops the finalists after the first whose beam decoding would not leave time to
    decode `after_sentences` more sentences at the beam (the scoring and the export), at the
    speed the beam ran so far.

    Each dev batch is a safe point (`stopping.check`); `kept` (a `KeptFigures`) keeps each
    candidate's BLEU, so a stopped choice goes on from the next candidate. `shortlist`: a
    lexical table every decoding here is restricted to (the export's; None: the whole
    vocabulary).
    """
    started = time.perf_counter()
    pairs = list(dev_pairs)[: plan.export.select_max_sentences]
    base = plan.settings.without_sampling()
    found = candidates(plan, layout, alpha)
    sets = list(dict.fromkeys((c.checkpoints, c.kind) for c in found))  # simplest first
    screen = plan.export.select_screen_sentences
    report(f"choosing the final model on {len(pairs)} dev sentences: {len(found)} candidates")
    kept, greedy = kept or KeptFigures(None), {}
    state = {"loaded": None, "cache": {}, "figures": {}, "shortlist": shortlist}
    if screen and len(sets) > plan.export.select_finalists:
        greedy = _screen(model, tokenizer, plan.data, pairs[:screen], base, sets, kept, state)
        sets = sorted(sets, key=lambda s: -greedy[s])  # stable: the simpler first on a tie
        for cps, kind in sets:
            what = Candidate(cps, 0.0, kind).describe().rsplit(",", 1)[0]  # no alpha
            report(f"  greedy dev BLEU {greedy[(cps, kind)]:6.2f}  {what}")
        sets = sets[: plan.export.select_finalists]
    key = figures_key(pairs=pairs, settings=dataclasses.asdict(base), data=plan.data,
                      shortlist=shortlist_key(shortlist))  # fmt: skip
    scores, beam_seconds, beam_decoded = [], 0.0, 0
    for index, (checkpoints, kind) in enumerate(sets):
        alphas = [c for c in found if (c.checkpoints, c.kind) == (checkpoints, kind)]
        if deadline is not None and beam_decoded:
            per_sentence = beam_seconds / beam_decoded
            needed = per_sentence * (len(alphas) * len(pairs) + after_sentences)
            if time.perf_counter() + needed > deadline:
                report(f"  the budget leaves no time for {len(sets) - index} more finalist(s)")
                break
        for candidate in alphas:
            settings = dataclasses.replace(base, alpha=candidate.alpha)
            began = time.perf_counter()
            bleu = _dev_bleu(model, tokenizer, plan.data, pairs, settings, candidate, kept,
                             ("choice", key), state)  # fmt: skip
            beam_seconds += time.perf_counter() - began
            beam_decoded += len(pairs)
            scores.append((candidate, bleu))
            report(f"  dev BLEU {bleu:6.2f}  {candidate.describe()}")
    ranked = sorted(scores, key=lambda cs: (-cs[1], cs[0].simplicity()))
    chosen = ranked[0][0]
    if state["loaded"] != chosen.checkpoints:
        load_checkpoints(model, chosen.checkpoints)
    seconds = round(time.perf_counter() - started, 1)
    report(f"chose {chosen.describe()} (dev BLEU {ranked[0][1]:.2f}) in {seconds:.1f}s")
    figures = state["figures"].get(_figure_name(chosen))
    dev_scores = None
    if figures is not None:
        settings = dataclasses.replace(base, alpha=chosen.alpha)
        dev_scores = (settings, len(pairs), figures, shortlist_key(shortlist))
    selection = {
        "sentences": len(pairs),
        "beam_size": base.beam_size,
        "seconds": seconds,
        "chosen": _candidate_json(chosen, ranked[0][1]),
        "candidates": [_candidate_json(c, bleu) for c, bleu in ranked],
        **_screened_json(greedy, len(pairs[:screen])),
    }
    return FinalModel(model, chosen.steps, chosen.alpha, selection, dev_scores)


def reused_dev_scores(final, settings, sentences, shortlist=None):
    """The choice's dev figures of `final` (a `FinalModel`) where scoring `sentences` dev
    sentences with `settings` over the lexical table `shortlist` (None: the whole vocabulary)
    would decode exactly what the choice decoded; else None."""
    if final.dev_scores is None:
        return None
    decoded_with, decoded, scores, over = final.dev_scores
    same = (decoded_with, decoded, over) == (settings, sentences, shortlist_key(shortlist))
    return scores if same else None


def _screened_json(greedy, sentences):
    """The selection's `screened` entry (nothing without a screening)."""
    if not greedy:
        return {}
    rows = [
        {"steps": [step for step, _ in cps], "kind": kind, "dev_bleu": bleu}
        for (cps, kind), bleu in greedy.items()
    ]
    return {"screened": {"sentences": sentences, "greedy_dev_bleu": rows}}


def _screen(model, tokenizer, data, pairs, base, sets, kept, state):
    """`{(checkpoints, kind): greedy dev BLEU on pairs}` of each checkpoint set."""
    settings = dataclasses.replace(base, beam_size=1)
    key = figures_key(pairs=pairs, settings=dataclasses.asdict(settings), data=data,
                      shortlist=shortlist_key(state["shortlist"]))  # fmt: skip
    return {
        (checkpoints, kind): _dev_bleu(
            model,
            tokenizer,
            data,
            pairs,
            settings,
            Candidate(checkpoints, 0.0, kind),
            kept,
            ("screen", key),
            state,
        )  # fmt: skip
        for checkpoints, kind in sets
    }


def _dev_bleu(model, tokenizer, data, pairs, settings, candidate, kept, section, state):
    """The dev BLEU of `candidate` decoded with `settings` (kept in `kept[section]`); loads its
    checkpoints into `model` unless `state["loaded"]` already holds them."""
    name = _figure_name(candidate)
    bleu = kept.get(*section, name)
    if bleu is None:
        if state["loaded"] != candidate.checkpoints:  # each set of checkpoints loaded once
            load_checkpoints(model, candidate.checkpoints)
            state["loaded"] = candidate.checkpoints
        figures, _ = evaluate_bleu(
            model, tokenizer, pairs, data, settings, _cache=state["cache"], stop_phase=PHASE,
            shortlist=state["shortlist"],
        )  # fmt: skip
        bleu = figures["bleu"]
        kept.put(*section, name, bleu)
        if section[0] == "choice":
            state["figures"][name] = figures
    return bleu


def _figure_name(candidate):
    return json.dumps([candidate.steps, candidate.kind, candidate.alpha])


def _candidate_json(candidate, bleu):
    return {
        "steps": candidate.steps,
        "kind": candidate.kind,
        "alpha": candidate.alpha,
        "dev_bleu": bleu,
        "description": candidate.describe(),
    }


def final_model(plan, layout, vocab_size, tokenizer=None, dev_pairs=None, select=None, **kw):
    """The final model of the workdir `layout`: rebuilt from `plan.model` (float32, outside any
    strategy), with the dev set's choice (`select`, default: `plan.selects`) or the
    average of the last `export.average_checkpoints` complete checkpoints.

    Args:
        plan: the run's `Plan` (`Plan.of(config, settings)`).
        layout: its `Workdir`.
        vocab_size: the vocabulary's size.
        tokenizer: the run's `Tokenizer` (needed to choose on dev).
        dev_pairs: the dev `[(source, reference)]` (needed to choose on dev).
        select: choose on dev (None: when the config says `auto`).
        **kw: `average` (a count instead of `export.average_checkpoints`), `alpha` (a fixed
            length penalty for the choice), `strict` (refuse fewer checkpoints than asked;
            default True), `report` (`line -> None`, default print), `kept` (a `KeptFigures`
            for the choice), `deadline` and `after_sentences` (a time budget: see `select_on_dev`),
            `shortlist` (a lexical table the choice decodes over: see `select_on_dev`).

    Returns:
        A `FinalModel`.

    Example:
    ```python
    layout = Workdir("workdirs/quickstart")
    config = load_config(layout.config)
    plan = Plan.of(config, decoding_settings(config, export=True))
    final = final_model(plan, layout, Tokenizer(layout.spm).vocab_size)
    ```
    """
    report = kw.get("report", print)
    model = build_transformer(plan.model, vocab_size)
    if select and not plan.selects:
        plan = plan.choosing_everything()  # asked for (export --select-on-dev): all candidates
    select = plan.selects if select is None else select
    if select and dev_pairs:
        return select_on_dev(
            model, tokenizer, plan, layout, dev_pairs, kw.get("alpha"), report, kw.get("kept"),
            kw.get("deadline"), kw.get("after_sentences", 0), kw.get("shortlist"),
        )  # fmt: skip
    if select:
        report("no dev set to choose the final model on: the last checkpoint, alpha as configured")
    count = kw.get("average") or plan.export.average_checkpoints
    count = 1 if count == AUTO else count
    checkpoints = last_checkpoints(layout, count, kw.get("strict", True))
    load_checkpoints(model, checkpoints)
    if len(checkpoints) > 1:
        report(f"averaged the last {len(checkpoints)} checkpoints")
    return FinalModel(model, [step for step, _ in checkpoints])
