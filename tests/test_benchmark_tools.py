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
