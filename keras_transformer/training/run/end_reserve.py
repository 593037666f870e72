"""The end of a time-budgeted run, measured while it trains, so that it fits the budget.

A `train.max_minutes` budget covers training and what follows it: the dev set's choice of the
final model, the dev and test scoring, the export's calibration and the export (the end). By
default (`train.end_minutes: null`) training stops a tenth of the budget before its end, or
earlier where the end needs more: at a dev evaluation `EndReserve` decodes a sample of the dev
sentences (`SAMPLE_BATCHES` decoding batches) with a float32 copy of the model (the end decodes
with the float32 final model) at the export's beam and greedily, and estimates the end's
seconds from those speeds and the sentences the end decodes (`end_work`), with a margin
(`MARGIN`); it measures again after each further 40% of training's budget. Training then
stops that estimate before the budget (never before half of it), and the learning rate's
decay is stretched to reach zero there (`RunState.schedule_scale`). The estimate is kept in
`WORKDIR/end_estimate.json`, so a resumed run stops at the same time and follows the same
curve until the next evaluation.

An explicit `train.end_minutes`, or training on several workers (where the stopping time is
every worker's decision), keeps the fixed reserve.
"""

import dataclasses
import json

import keras

from keras_transformer.config import AUTO, budget_seconds
from keras_transformer.evaluation import translate_sentences
from keras_transformer.workdir import join, read_json, write_atomically

ESTIMATE_FILE = "end_estimate.json"  # in WORKDIR
# The sample decoded per estimate: the first SAMPLE_BATCHES decoding batches of the evaluator's
# dev sentences, sorted and batched as the end decodes (a single batch runs as long as its
# longest sentence, which over-counts a set decoded in many sorted batches two-fold and more).
SAMPLE_BATCHES = 4
# The speeds are measured again once training has run this part of its budget since the last.
REMEASURE_SHARE = 0.4
# What the sample's speeds miss (loading and averaging the candidates' checkpoints, saving the
# export: counted as traces): on a 20-minute Tatoeba run the end took 1.12x the estimate made
# from the final model's own speeds (ledger select_on_dev, budget_20min_seed42).
MARGIN = 1.2
MIN_TRAINING_SHARE = 0.5  # training keeps at least this part of the budget
# The export traces its signatures (translate, n-best, score, prefix) and the calibration's
# feature function, and saves the SavedModel: counted as traces of a decoding function, as is
# loading (and averaging) each candidate's checkpoints.
EXPORT_TRACES = 6


@dataclasses.dataclass(frozen=True)
class EndWork:
    """What the end of a run decodes.

    Attributes:
        beam: sentences decoded with the export's beam (candidates, scoring, calibration).
        greedy: sentences decoded greedily (the screening of the candidates).
        traces: decoding functions traced anew.
    """

    beam: int
    greedy: int
    traces: int

    def seconds(self, beam_seconds, greedy_seconds, trace_seconds):
        """The end's seconds at these speeds (seconds per sentence; seconds per trace)."""
        return self.beam * beam_seconds + self.greedy * greedy_seconds + self.traces * trace_seconds


def end_work(plan, scoring, dev_sentences, test_sentences):
    """The `EndWork` of the end with `dev_sentences` and `test_sentences` pairs, the final
    model made by `plan` (a `final_model.Plan`) and scored with the `DecodingSettings`
    `scoring`: the choice's candidates (screened greedily, the finalists at the beam), the dev
    scoring (unless it reuses the choice's decoding), the test scoring and the calibration."""
    from keras_transformer.export.saved_model import MAX_CALIBRATION_SENTENCES
    from keras_transformer.final_model import ALPHA_CANDIDATES

    e = plan.export
    calibration = min(dev_sentences, MAX_CALIBRATION_SENTENCES)
    beam, greedy, traces = test_sentences + calibration, 0, 1 + EXPORT_TRACES
    choosing = bool(dev_sentences) and plan.selects
    select = min(dev_sentences, e.select_max_sentences)
    beam += 0 if scoring_reuses_the_choice(plan, scoring, dev_sentences) else dev_sentences
    if choosing:
        sets = len({1, 2, 3, plan.keep_checkpoints}) if e.average_checkpoints == AUTO else 1
        sets += 2 if (plan.keep_best and e.average_checkpoints == AUTO) else 0
        alphas = len(ALPHA_CANDIDATES) if plan.chooses_alpha else 1
        finalists = sets
        if e.select_screen_sentences and sets > e.select_finalists:
            finalists = e.select_finalists
            greedy = sets * min(e.select_screen_sentences, select)
            traces += 1
        beam += finalists * alphas * select
        traces += alphas + sets  # each set's checkpoints loaded (and averaged) once
    return EndWork(beam, greedy, traces)


def scoring_reuses_the_choice(plan, scoring, dev_sentences):
    """True when the dev scoring (with the `DecodingSettings` `scoring`) reuses the choice's
    decoding of the chosen candidate (`final_model.reused_dev_scores`): the choice (`plan`)
    decodes every one of the `dev_sentences` with the scoring's search (the export's, but for
    the alpha it chooses)."""
    if not dev_sentences or not plan.selects:
        return False
    scoring = dataclasses.replace(scoring.without_sampling(), alpha=0.0)
    choice = dataclasses.replace(plan.settings.without_sampling(), alpha=0.0)
    return scoring == choice and plan.export.select_max_sentences >= dev_sentences


def training_seconds(train, end_seconds):
    """Training's part of `train.max_minutes` when the end needs `end_seconds`: the budget less
    the larger of those and the fixed reserve (`budget_seconds`), but at least half of it."""
    total = train.max_minutes * 60
    fixed = budget_seconds(train)[0]
    return max(min(fixed, total - end_seconds), MIN_TRAINING_SHARE * total)


def read_estimate(root, train):
    """The kept estimate of the workdir `root` (a dict) where made under the same budget."""
    kept = read_json(join(root, ESTIMATE_FILE)) or {}
    same = (kept.get("max_minutes"), kept.get("end_minutes")) == (
        train.max_minutes,
        train.end_minutes,
    )
    return kept if kept and same else None


def estimates(train, strategy_is_multi_worker):
    """True when the end's seconds are estimated during training (see the module), under the
    `train:` section `train`."""
    t = train
    return t.max_minutes is not None and t.end_minutes is None and not strategy_is_multi_worker


class EndReserve(keras.callbacks.Callback):
    """At each dev evaluation, estimates the end's seconds and moves the stop of training (and
    the learning rate's decay) so that the end fits the budget (see the module).

    Args:
        train: the run's `train:` section (the budget).
        data: its `data:` section (how the sample is decoded).
        beam: the export's `DecodingSettings` without sampling: the end's beam search (its
            greedy search is the same at beam 1).
        evaluator: the run's `DevEvaluator` (the same evaluations; its first dev pairs probe).
        stopper: the run's `StopAtStep` (its `max_seconds` moves).
        work: the end's `EndWork`.
        twin: `() -> model`: a float32 model of the same architecture (built once).
        root: the workdir, where the estimate is kept; None keeps nothing.
    The probes are timed with the run state's timer (`stopper.run_state.timer`).
    """

    def __init__(self, train, data, beam, evaluator, stopper, work, twin, root=None):
        super().__init__()
        self.train, self.data, self.beam = train, data, beam
        self.evaluator = evaluator
        self.stopper = stopper
        self.work = work
        self.twin = twin
        self.root = root
        self.estimate = None  # the last estimate: a dict (see `apply`)
        self._twin = None
        self._cache = {}
        self._traced = {}  # settings -> seconds of the first call less a timed call's
        self._measured_at = None  # training seconds at the last measurement
        kept = read_estimate(root, train) if root else None
        if kept:
            self.apply(kept["end_seconds"], kept.get("speeds", {}), keep=False)

    def on_epoch_end(self, epoch, logs=None):
        from keras_transformer.training.run.callbacks import optimizer_step

        if self.model.stop_training or self.evaluator.skips(optimizer_step(self.model)):
            return  # training is over: nothing left to move
        elapsed, budget = self.stopper.elapsed, budget_seconds(self.train)[0]
        if self._measured_at is not None and elapsed - self._measured_at < (
            REMEASURE_SHARE * budget
        ):
            return  # measured lately: each measurement costs training time
        self._measured_at = elapsed
        greedy = dataclasses.replace(self.beam, beam_size=1)
        speeds = {"beam": self.measure(self.beam), "greedy": self.measure(greedy)}
        speeds["trace"] = max(self._traced.values())
        end = MARGIN * self.work.seconds(speeds["beam"], speeds["greedy"], speeds["trace"])
        self.apply(end, speeds)

    def measure(self, settings):
        """Seconds per sentence of the float32 copy of the model decoding the sample (the
        first time twice: the first call's extra seconds are its trace's)."""
        if self._twin is None:
            self._twin = self.twin()
        self._twin.set_weights(self.model.get_weights())
        sample = self.evaluator.pairs[: SAMPLE_BATCHES * settings.batch_size]
        sources = [s for s, _ in sample]
        data = self.data

        def timed():
            began = self.stopper.run_state.timer()
            translate_sentences(self._twin, self.evaluator.tokenizer, sources, data, settings,
                                self._cache)  # fmt: skip
            return self.stopper.run_state.timer() - began

        first = timed() if settings not in self._traced else None
        seconds = timed()
        if first is not None:
            self._traced[settings] = max(0.0, first - seconds)
        return seconds / len(sources)

    def apply(self, end_seconds, speeds=None, keep=True):
        """Training stops when the end's `end_seconds` are left of the budget."""
        t = self.train
        fixed = budget_seconds(t)[0]
        seconds = training_seconds(t, end_seconds)
        previous = self.stopper.max_seconds
        self.stopper.max_seconds = seconds
        self.stopper.run_state.schedule_scale = fixed / seconds
        self.estimate = {
            "max_minutes": t.max_minutes,
            "end_minutes": t.end_minutes,
            "end_seconds": round(float(end_seconds), 1),
            "training_seconds": round(seconds, 1),
            "speeds": speeds or {},
        }
        if keep and self.root:
            write_atomically(join(self.root, ESTIMATE_FILE), json.dumps(self.estimate, indent=1))
        if previous is None or abs(seconds - previous) >= 1.0:
            total = t.max_minutes * 60
            over = total - end_seconds < MIN_TRAINING_SHARE * total
            print(
                f"the end (choice, scoring, export) needs about {end_seconds:.0f}s at the "
                f"speed measured now: training stops at {seconds / 60:.1f} of the "
                f"{t.max_minutes:g} budget minutes"
                + (
                    "; more than half the budget: the end may overrun it (fewer dev "
                    "sentences: export.select_max_sentences)"
                    if over
                    else ""
                )  # fmt: skip
            )
