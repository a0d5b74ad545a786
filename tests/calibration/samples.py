"""Sample outputs in the tools' documented formats (nccl-tests doc/PERFORMANCE.md and
README; aws-neuron-sdk nccom-test.rst), with times written from a known model."""

from __future__ import annotations

from collections.abc import Callable

_OOP = " " * 62 + "out-of-place" + " " * 23 + "in-place"
_COLS = "   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
_UNITS = "                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
NCCL_HEAD = (
    "# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 4(factor) warmup iters: 5 "
    "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n{ranks}#\n"
    f"#{_OOP}\n#       size         count      type{_COLS}\n#        (B)    (elements){_UNITS}\n"
)
NCCL_TAIL = """# Out of bounds values : 0 OK
# Avg bus bandwidth    : 101.2
#
"""

SIZES = [2**k for k in range(10, 31, 2)]


def nccl_tests(time_s: Callable[[int], float], ranks: int = 8) -> str:
    """An all_reduce_perf output whose out-of-place time of size n is time_s(n)."""
    lines = "".join(
        f"#  Rank {r:2d} Group  0 Pid  {4000 + r} on     node0 device  {r} [0x{r:02x}] "
        "NVIDIA H100 80GB HBM3\n"
        for r in range(ranks)
    )
    rows = []
    for n in SIZES:
        t_us = time_s(n) * 1e6
        alg = n / t_us / 1e3
        bus = alg * 2 * (ranks - 1) / ranks
        rows.append(
            f"{n:>12d}  {n // 4:>12d}     float     sum      -1"
            f"  {t_us:8.2f}  {alg:6.2f}  {bus:6.2f}      0"
            f"  {t_us:8.2f}  {alg:6.2f}  {bus:6.2f}      0"
        )
    return NCCL_HEAD.format(ranks=lines) + "\n".join(rows) + "\n" + NCCL_TAIL


def nccom_test(time_s: Callable[[int], float], ranks: int = 64) -> str:
    """An nccom-test all-reduce output (``-r ranks``)."""
    out = [
        f"$ nccom-test -r {ranks} -b 1KB -e 1GB -f 4 -n 5 -w 5 -d fp32 allr",
        "    size(B)    count(elems)     type    time:avg(us)    algbw(GB/s)    busbw(GB/s)",
    ]
    for n in SIZES:
        t_us = time_s(n) * 1e6
        alg = n / t_us / 1e3
        out.append(
            f"{n:>11d} {n // 4:>15d}     fp32 {t_us:15.2f} {alg:14.2f} "
            f"{alg * 2 * (ranks - 1) / ranks:14.2f}"
        )
    out.append("Avg bus bandwidth:\t12.3456GB/s")
    return "\n".join(out) + "\n"
