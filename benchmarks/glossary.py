"""Soft glossaries (Dinu et al. 2019), measured: the term use rate and BLEU of a model trained
without and with glossary annotations (`data.terminology`), on held-out pairs.

1. a term list: `--terms FILE` (TSV), or drawn from the training pairs: for each frequent
   source word, the target word of the highest Dice coefficient over the pairs, kept when that
   is at least `--min-dice` (on the synthetic corpus, whose target is a function of the source,
   these are the lexicon's word translations);
2. train `plain` (no annotations) and `soft` (`data.terminology` = the list,
   `data.terminology_fraction` = `--fraction`) with `keras-transformer train --config CONFIG`
   (the same config and budget), each exported;
3. on the test pairs, each with the entries it holds (source term in the source, target term in
   the reference: the glossary a user would give for that sentence), translate with
   `plain`'s `serving_default`, `soft`'s `serving_default` (no glossary) and `soft`'s
   `translate_glossary` (its glossary); and with hard constraints (`translate_constrained`,
   the entries' target terms as the constraints): `plain_constrained` (`plain`'s export) and
   `soft_glossary_constrained` (`soft`'s, its sources annotated by `glossary.annotate`: both
   at once); report for each the term use rate (entries whose target term appears whole in the
   output, over the entries), the share of sentences whose constraints were all met (the
   constrained systems), test BLEU and chrF (sacreBLEU, every test pair) and sentences per
   second of the translation call (a speed figure only when the machine ran nothing else).

Prints one JSON line per system; with `BENCH_LABEL` set they are appended to the ledger
`benchmarks/results/glossary.jsonl` (`benchmarks/ledger.py`). Finished trainings are skipped
when run again with the same `--work`.

    BENCH_LABEL=synthetic_quickstart PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/glossary.py --work workdirs/glossary_bench
"""

import argparse
import collections
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, train_system  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw_terms(pairs, count, min_count, min_dice, min_length=5):
    """`[(source word, target word)]`: the `count` most frequent source words (seen in at least
    `min_count` pairs, at least `min_length` characters: not the function words) whose best
    target word by Dice coefficient reaches `min_dice`."""
    source_df, target_df, both = collections.Counter(), collections.Counter(), {}
    for source, target in pairs:
        words, translations = set(re.findall(r"\w+", source)), set(re.findall(r"\w+", target))
        source_df.update(words)
        target_df.update(translations)
        for word in words:
            both.setdefault(word, collections.Counter()).update(translations)
    terms = []
    for word, df in source_df.most_common():
        if df < min_count or len(terms) >= count:
            break
        if len(word) < min_length:
            continue
        target, joint = both[word].most_common(1)[0]
        if 2 * joint / (df + target_df[target]) >= min_dice:
            terms.append((word, target))
    return terms


def train(args, work, name, terms_file=None):
    """`keras-transformer train` of one system (`common.train_system`), with annotations when
    `terms_file` is given; returns the path of its export."""
    settings = []
    if terms_file:
        settings += [f"data.terminology={terms_file}", f"data.terminology_fraction={args.fraction}"]
    return train_system(args.config, work, name, [*settings, *args.set])


def translate(model_dir, texts, glossaries=None, batch_size=32, mode="glossary"):
    """`(translations, seconds, met)` of the SavedModel's `serving_default` (`glossaries`
    None), of `translate_glossary` with one glossary (a list of entries) per text (`mode`
    "glossary"), or of `translate_constrained` with each glossary's target terms as the text's
    constraints (`mode` "constrained"; "both": the texts annotated with their glossaries
    first). `met`: the constrained modes' `constraints_met` per text, else None."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from keras_transformer import glossary
    from keras_transformer.export.saved_model import resolve_model_dir

    loaded = tf.saved_model.load(resolve_model_dir(model_dir))
    if glossaries is None:
        key = "serving_default"
    else:
        key = "translate_glossary" if mode == "glossary" else "translate_constrained"
    signature, out, met, seconds = loaded.signatures[key], [], [], 0.0
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        rows = None if glossaries is None else glossaries[start : start + batch_size]
        if mode == "both" and rows is not None:
            batch = [glossary.annotate(text, row) for text, row in zip(batch, rows)]
        inputs = {"text": tf.constant(batch)}
        if rows is not None and mode == "glossary":
            sources, targets = glossary.padded(rows)
            shape = [len(batch), max((len(row) for row in sources), default=0)]
            inputs["glossary_source"] = tf.reshape(tf.constant(sources, tf.string), shape)
            inputs["glossary_target"] = tf.reshape(tf.constant(targets, tf.string), shape)
        elif rows is not None:
            width = max([1] + [len(row) for row in rows])
            padded = [[t for _, t in row] + [""] * (width - len(row)) for row in rows]
            inputs["constraints"] = tf.constant(padded, tf.string, [len(batch), width])
        started = time.perf_counter()
        result = signature(**inputs)
        seconds += time.perf_counter() - started
        out.extend(t.decode("utf-8", "replace") for t in result["translation"].numpy())
        if "constraints_met" in result:
            met.extend(bool(m) for m in result["constraints_met"].numpy())
    return out, seconds, (met or None)


def term_use_rate(outputs, glossaries):
    """Entries whose target term occurs whole in the output, over all entries."""
    used = total = 0
    for output, entries in zip(outputs, glossaries):
        for _, target in entries:
            total += 1
            used += re.search(r"(?<!\w)" + re.escape(target) + r"(?!\w)", output) is not None
    return used / total if total else None


def _met_rate(met, glossaries):
    """The share of the sentences holding glossary entries whose constraints were all met."""
    if met is None:
        return None
    rows = [m for m, entries in zip(met, glossaries) if entries]
    return round(sum(rows) / len(rows), 4) if rows else None


def run(args, work):
    import sacrebleu

    from keras_transformer import glossary
    from keras_transformer.data import read_pairs

    terms_file = os.path.join(work, "terms.tsv")
    if args.terms:
        terms = glossary.load_glossary(args.terms)
    else:
        terms = draw_terms(read_pairs(args.train, verbose=False), args.count, args.min_count,
                           args.min_dice)  # fmt: skip
    with open(terms_file, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in terms)
    args.set = [f"data.train={args.train}", f"data.test={args.test}", *args.set]
    models = {"plain": train(args, work, "plain"), "soft": train(args, work, "soft", terms_file)}
    test = read_pairs(args.test, verbose=False)
    finder = glossary.TermAnnotator(terms, 1.0)
    sources, references = [s for s, _ in test], [t for _, t in test]
    glossaries = [finder.found(s, t) for s, t in test]
    systems = {
        "plain": (models["plain"], None, None),
        "soft_no_glossary": (models["soft"], None, None),
        "soft_glossary": (models["soft"], glossaries, "glossary"),
        "plain_constrained": (models["plain"], glossaries, "constrained"),
        "soft_glossary_constrained": (models["soft"], glossaries, "both"),
    }
    for system, (model, given, mode) in systems.items():
        outputs, seconds, met = translate(model, sources, given, mode=mode)
        emit(
            figure="glossary", system=system, train=args.train, test=args.test,
            terms=len(terms), fraction=args.fraction if system != "plain" else None,
            test_sentences=len(test), sentences_with_terms=sum(1 for g in glossaries if g),
            term_entries=sum(len(g) for g in glossaries),
            term_use_rate=term_use_rate(outputs, glossaries),
            constraints_met=_met_rate(met, glossaries),
            test_bleu=round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
            test_chrf=round(sacrebleu.corpus_chrf(outputs, [references]).score, 2),
            sentences_per_second=round(len(test) / max(seconds, 1e-9), 1),
            overrides=args.set,
        )  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "quickstart.yaml"))
    parser.add_argument("--train", default="synthetic:split=train", help="data.train")
    parser.add_argument("--test", default="synthetic:split=test,size=1000", help="data.test")
    parser.add_argument("--terms", help="a TSV term list (default: drawn from --train)")
    parser.add_argument("--count", type=int, default=200, help="terms drawn at most")
    parser.add_argument("--min-count", type=int, default=20, help="pairs a drawn term is in")
    parser.add_argument("--min-dice", type=float, default=0.8, help="a drawn term's Dice")
    parser.add_argument("--fraction", type=float, default=0.1, help="terminology_fraction")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="for every training"
    )
    parser.add_argument("--work", default=None, help="work directory (default: a new temp one)")
    args = parser.parse_args()
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="glossary_"))
    os.makedirs(work, exist_ok=True)
    print(f"work directory: {work}", file=sys.stderr, flush=True)
    run(args, work)


if __name__ == "__main__":
    main()
