"""The benchmark scripts' own arithmetic (their figures are only as good as it is)."""

import pytest

from benchmarks.profile_ops import attribute_wall_time, is_matmul


def test_wall_time_is_divided_among_the_ops_running_at_each_moment():
    # 0-10: A alone; 10-20: A and B; 20-30: A, B and a second B; 30-40: nothing; 40-50: C.
    ops = [(0, 30, "A"), (10, 30, "B"), (20, 30, "B"), (40, 50, "C")]
    shares, idle = attribute_wall_time(ops, 0, 60)
    assert shares["A"] == pytest.approx(10 + 5 + 10 / 3)
    assert shares["B"] == pytest.approx(5 + 20 / 3)
    assert shares["C"] == pytest.approx(10)
    assert idle == pytest.approx(10 + 10)
    assert sum(shares.values()) + idle == pytest.approx(60)


def test_wall_time_outside_the_window_is_not_counted():
    shares, idle = attribute_wall_time([(-5, 5, "A"), (8, 20, "B")], 0, 10)
    assert shares == pytest.approx({"A": 5, "B": 2})
    assert idle == pytest.approx(3)


@pytest.mark.parametrize(
    "op_type, expected",
    [
        ("_MklMatMul", True),
        ("_MklNativeFusedMatMul", True),
        ("_MklEinsum", True),
        ("BatchMatMulV2", True),
        ("_MklBatchMatMulV2", True),
        ("MatMul", True),
        ("_MklTranspose", False),
        ("ResourceApplyAdam", False),
        ("StatelessRandomUniformV2", False),
    ],
)
def test_matrix_products_are_told_from_other_ops(op_type, expected):
    assert is_matmul(op_type) is expected


class _FakeSignature:
    """A `serving_default` stand-in: records each request and advances a fake clock by the
    request's size in milliseconds (so each request's latency is known)."""

    def __init__(self, clock, short=False):
        self.clock, self.short, self.requests = clock, short, []

    def __call__(self, text):
        import tensorflow as tf

        batch = [t.decode() for t in text.numpy()]
        self.requests.append(batch)
        self.clock.now += len(batch) * 1e-3 * (1 + len(self.requests) % 3)  # 1, 2 or 3 ms each
        answers = batch[:-1] if self.short else batch
        return {"translation": tf.constant(answers, dtype=tf.string)}


def test_request_size_figures_time_each_request_of_n_sentences(monkeypatch):
    from benchmarks import serve_latency

    clock = type("Clock", (), {"now": 0.0})()
    monkeypatch.setattr(serve_latency.time, "perf_counter", lambda: clock.now)
    sentences = [f"s{i}" for i in range(10)]
    serve = _FakeSignature(clock)
    figures = serve_latency.request_size_figures(serve, sentences, size=4, calls=3)
    # A warm-up request, then 3 timed ones; consecutive sentences, cycling through the pool.
    assert serve.requests == [
        ["s0", "s1", "s2", "s3"],
        ["s4", "s5", "s6", "s7"],
        ["s8", "s9", "s0", "s1"],
        ["s2", "s3", "s4", "s5"],
    ]
    latencies = [4 * 3, 4 * 1, 4 * 2]  # ms: requests 2, 3 and 4 of the fake's sequence
    assert figures["sentences"] == 4 and figures["calls"] == 3
    assert figures["p50_ms"] == pytest.approx(8.0)
    assert figures["p99_ms"] == pytest.approx(11.92, abs=0.05)  # interpolated, rounded
    assert figures["mean_ms"] == pytest.approx(8.0)
    assert figures["sentences_per_s"] == pytest.approx(12 / (sum(latencies) / 1e3), rel=1e-3)


def test_request_size_figures_reject_an_answer_per_sentence_missing(monkeypatch):
    from benchmarks import serve_latency

    clock = type("Clock", (), {"now": 0.0})()
    monkeypatch.setattr(serve_latency.time, "perf_counter", lambda: clock.now)
    with pytest.raises(RuntimeError, match="3 translations for a request of 4 sentences"):
        serve_latency.request_size_figures(_FakeSignature(clock, short=True), ["a"] * 8, 4, 2)


def test_ledger_lines_tell_two_generations_of_one_cpu_name_apart(tmp_path):
    """Two CPUs both named "AMD EPYC" (a Zen 4 and a Zen 5, whose fp32 products differ 2.3x)
    get different `cpu` fields; a machine without the numbers gets None."""
    from benchmarks import ledger

    def cpuinfo(family, model):
        block = (
            f"processor\t: {{n}}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n"
            f"model\t\t: {model}\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f\n\n"
        )
        path = tmp_path / f"cpuinfo-{family}-{model}"
        path.write_text(block.format(n=0) + block.replace(str(model), "99").format(n=1))
        return str(path)

    zen4, zen5 = cpuinfo(25, 17), cpuinfo(26, 2)
    assert ledger.cpu_info(zen4) == ledger.cpu_info(zen5) == ("AMD EPYC", ["avx512f"])
    assert ledger.cpu_generation(zen4) == "family 25, model 17"
    assert ledger.cpu_generation(zen5) == "family 26, model 2"
    (tmp_path / "bare").write_text("processor\t: 0\nmodel name\t: Apple M2\n\n")
    assert ledger.cpu_generation(str(tmp_path / "bare")) is None
    assert ledger.cpu_generation(str(tmp_path / "missing")) is None


def test_ledger_lines_hold_no_path_of_the_measuring_machine(tmp_path, monkeypatch):
    """A ledger line's command and fields are written as a user runs them from the repository
    root (lines held /work/..., /tmp/... and ../shared/... paths of the machine that measured
    them): inside the repository relative to it, a temporary directory as DIR, others by name."""
    import json
    import os

    from benchmarks import ledger

    monkeypatch.setattr(ledger, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(ledger.tempfile, "gettempdir", lambda: str(tmp_path))
    script = os.path.join(ledger.REPO, "benchmarks", "quality_budget.py")
    work = str(tmp_path / "qb" / "work")
    monkeypatch.setattr(ledger.sys, "argv", [script, "--work", work, "--tmp=" + work])
    corpus = os.path.join(ledger.REPO, "data", "tatoeba-en-de")
    line = ledger.record(
        "toy",
        {
            "corpus": corpus,
            "test": f"text:{corpus}/test.en,{corpus}/test.de",
            "model": "/srv/exports/quickstart",
            "summary": {"prepared": [work + "/prepared", "3 shards"]},
            "unit": "tokens/s, ours / theirs, https://example.org/a/b",
        },
        label="toy",
    )
    assert line["command"] == (
        "python benchmarks/quality_budget.py --work DIR/work --tmp=DIR/work"
    )
    assert line["corpus"] == "data/tatoeba-en-de"
    assert line["test"] == "text:data/tatoeba-en-de/test.en,data/tatoeba-en-de/test.de"
    assert line["model"] == "DIR/quickstart"
    assert line["summary"] == {"prepared": ["DIR/work/prepared", "3 shards"]}
    assert line["unit"] == "tokens/s, ours / theirs, https://example.org/a/b"
    with open(tmp_path / "results" / "toy.jsonl", encoding="utf-8") as f:
        assert json.loads(f.read()) == line


def test_a_ci_log_is_read_into_one_line_per_phase_with_its_slowest_tests():
    """`benchmarks/ci_times.py`: a phase's pytest runs (passed counts summed, their slowest
    tests merged and ranked) belong to the `ci:` line that follows them."""
    from benchmarks.ci_times import phases

    log = [
        "+ pip install ...",
        "============ slowest 15 durations ============",
        "30.50s call     tests/test_a.py::test_x",
        "2.00s setup    tests/test_a.py::test_y",
        "846 passed, 2 deselected in 500.12s (0:08:20)",
        "4.10s call     tests/test_b.py::test_z[p]",
        "163 passed in 90.01s",
        "ci: fast-tier: 762s, peak memory 4.5 GB (exit 0; summed resident sets: 6.0 GB)",
        "ci: fast-tier: the CPUs were busy 95% of the time (2 cores)",
        "99.00s call     tests/test_c.py::test_w",
        "12 passed, 1 rerun in 120.00s",
        "ci: scenario-tier: 130s, peak memory ? GB (exit 0; summed resident sets: ? GB)",
        "ci: line coverage of keras_transformer/ (both tiers): 96.0%",
        "CI finished in 1200s",
    ]
    found, total = phases(log, top=2)
    assert [p["phase"] for p in found] == ["fast-tier", "scenario-tier"]
    fast, scenario = found
    assert (fast["seconds"], fast["peak_gb"], fast["tests"]) == (762, 4.5, 846 + 163)
    assert fast["slowest"] == [[30.5, "call tests/test_a.py::test_x"],
                               [4.1, "call tests/test_b.py::test_z[p]"]]  # fmt: skip
    assert (scenario["peak_gb"], scenario["tests"]) == (None, 12)
    assert scenario["slowest"] == [[99.0, "call tests/test_c.py::test_w"]]
    assert total == {"seconds": 1200, "coverage": 96.0}
