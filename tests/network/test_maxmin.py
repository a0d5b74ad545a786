"""Max-min fair rates: hand-solved cases and properties against the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.network.flows import maxmin_rates, maxmin_rates_csc, maxmin_rates_reference
from clustersim.network.flows.maxmin import _stable_order


def solve(matrix: list[list[float]], capacity: list[float]) -> np.ndarray:
    inc = sp.csr_matrix(np.asarray(matrix, dtype=float))
    fast = maxmin_rates(inc, np.asarray(capacity, dtype=float))
    slow = maxmin_rates_reference(inc, capacity)
    np.testing.assert_allclose(fast, slow, rtol=1e-9)
    return fast


def test_long_flow_and_two_short_flows_share_equally() -> None:
    # Entities: long (both links), short0 (link 0), short1 (link 1).
    rates = solve([[1, 1, 0], [1, 0, 1]], [1.0, 1.0])
    np.testing.assert_allclose(rates, [0.5, 0.5, 0.5])


def test_unequal_capacities_give_the_slack_to_the_short_flow() -> None:
    rates = solve([[1, 1, 0], [1, 0, 1]], [1.0, 2.0])
    np.testing.assert_allclose(rates, [0.5, 0.5, 1.5])


def test_parking_lot() -> None:
    # One flow over 3 links, one local flow per link; the middle link is the narrowest.
    rates = solve([[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], [3.0, 1.0, 3.0])
    np.testing.assert_allclose(rates, [0.5, 2.5, 0.5, 2.5])


def test_entity_with_two_flows_on_a_link_counts_twice() -> None:
    # Entity 0 puts 2 flows on link 0; entity 1 puts 1: 2r + r = 1.
    rates = solve([[2, 1]], [1.0])
    np.testing.assert_allclose(rates, [1 / 3, 1 / 3])


def test_weighted_entity_frees_capacity_elsewhere() -> None:
    # Entity 0: two flows on link 0 and one on link 1; entity 1 alone on link 1.
    rates = solve([[2, 0], [1, 1]], [1.0, 1.0])
    np.testing.assert_allclose(rates, [0.5, 0.5])
    rates = solve([[2, 0], [1, 1]], [1.0, 10.0])
    np.testing.assert_allclose(rates, [0.5, 9.5])


def test_entity_without_links_is_infinite_and_zero_capacity_stalls() -> None:
    rates = solve([[1, 0, 1], [0, 0, 1]], [0.0, 1.0])
    assert rates[0] == 0.0
    assert math.isinf(rates[1])
    assert rates[2] == 0.0


def test_accepts_csc_and_empty() -> None:
    inc = sp.csc_matrix(np.array([[1.0, 1.0], [1.0, 0.0]]))
    np.testing.assert_allclose(maxmin_rates(inc, np.array([2.0, 3.0])), [1.0, 1.0])
    assert maxmin_rates(sp.csr_matrix((3, 0)), np.ones(3)).shape == (0,)
    with pytest.raises(ValueError, match="shape"):
        maxmin_rates(inc, np.ones(3))


@st.composite
def problems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n_links = draw(st.integers(1, 6))
    n_ent = draw(st.integers(1, 7))
    cells = st.sampled_from([0, 0, 0, 1, 1, 2, 3])
    matrix = np.array(
        draw(
            st.lists(
                st.lists(cells, min_size=n_ent, max_size=n_ent), min_size=n_links, max_size=n_links
            )
        ),
        dtype=float,
    )
    cap = np.array(
        draw(
            st.lists(
                st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 7.0]) | st.floats(0.1, 10.0),
                min_size=n_links,
                max_size=n_links,
            )
        )
    )
    return matrix, cap


@settings(max_examples=300, deadline=None)
@given(problems())
def test_vectorised_matches_reference_and_is_max_min_fair(
    problem: tuple[np.ndarray, np.ndarray],
) -> None:
    matrix, cap = problem
    inc = sp.csr_matrix(matrix)
    rates = maxmin_rates(inc, cap)
    np.testing.assert_allclose(rates, maxmin_rates_reference(inc, cap), rtol=1e-7)

    crosses = matrix > 0
    routed = crosses.any(axis=0)
    assert np.isinf(rates[~routed]).all()
    assert np.isfinite(rates[routed]).all()
    r = np.where(routed, rates, 0.0)
    load = matrix @ r
    # No link over capacity.
    assert (load <= cap * (1 + 1e-9)).all()
    # Bottleneck property: each routed entity crosses a saturated link on which it is the fastest.
    saturated = load >= cap * (1 - 1e-7)
    for e in np.flatnonzero(routed):
        links = np.flatnonzero(crosses[:, e] & saturated)
        assert any(r[e] >= r[crosses[link]].max() * (1 - 1e-7) for link in links), e


@settings(max_examples=300, deadline=None)
@given(problems())
def test_raw_columns_give_the_rates_of_the_matrix_bit_for_bit(
    problem: tuple[np.ndarray, np.ndarray],
) -> None:
    """The raw-column solve finds its first round's entities by entity and sorts its
    nonzeros by link only for later rounds: the same rates as the matrix's solve."""
    matrix, cap = problem
    csc = sp.csc_matrix(matrix)
    csc.eliminate_zeros()
    indptr = csc.indptr.astype(np.int64)
    rows = csc.indices.astype(np.int64)
    raw = maxmin_rates_csc(indptr, rows, csc.data.astype(np.float64), cap)
    np.testing.assert_array_equal(raw, maxmin_rates(csc, cap))


def test_explicit_zeros_are_ignored_and_the_input_is_untouched() -> None:
    data = np.array([1.0, 0.0, 1.0])
    inc = sp.csc_matrix((data, np.array([0, 1, 1]), np.array([0, 2, 3])), shape=(2, 2))
    np.testing.assert_allclose(maxmin_rates(inc, np.array([1.0, 1.0])), [1.0, 1.0])
    np.testing.assert_array_equal(inc.data, [1.0, 0.0, 1.0])
    csr = inc.tocsr()
    np.testing.assert_allclose(maxmin_rates(csr, np.array([1.0, 1.0])), [1.0, 1.0])
    assert csr.nnz == 3


@pytest.mark.parametrize("size", [1, 50, 1 << 16, (1 << 16) + 1, 3_000_000])
def test_the_order_by_link_is_the_stable_sort(size: int) -> None:
    keys = np.random.default_rng(size).integers(0, size, 20_000)
    assert np.array_equal(_stable_order(keys, size), np.argsort(keys, kind="stable"))
