"""Studies: many scenarios from one base, run on a local process pool or on Dask.

``clustersim sweep STUDY.yaml`` expands a study into points, simulates each one
in a worker (in-process: no subprocess per point), persists every finished point
at once and gathers them into ``results.parquet``. A rerun skips the points
already done, so a study killed part-way resumes where it stopped.

The study file (stable format)::

    name: trn2-llama3-8b-tp-microbatch   # identifies the study; --out refuses another's
    description: TP and microbatch size for Llama-3-8B on one trn2.48xlarge
    base: ../trn2-llama3-8b.yaml         # a scenario file, relative to this file,
                                         # or an inline scenario mapping; a file must
                                         # lie under this file's directory or the
                                         # working directory (else --allow-outside)
    set:                                 # overrides applied to every point, as --set
      training.global_batch_size: 32
    axes:                                # the points: the cartesian product of the axes,
      - grid:                            # the first axis varying slowest
          parallelism.tp: [4, 8, 16]     # grid: every combination of its keys' values
          parallelism.microbatch_size: [1, 2]
      - zip:                             # zip: the lists in lockstep (equal lengths)
          cluster.instance: [trn2.48xlarge, p5.48xlarge]
          name: [trn2, h100]
      - random:                          # random: n draws from a seeded generator
          n: 16
          seed: 1
          keys:
            cluster.chip.calibration.link_efficiency: {uniform: [0.7, 0.95], round: 3}
            cluster.efa.bandwidth_Bps: {loguniform: [100e9, 400e9]}
            training.seq_len: {choice: [4096, 8192]}
            parallelism.microbatch_size: {integers: [1, 4]}   # both ends included
            cluster.chip.calibration.tensor_efficiency: {normal: [0.85, 0.03]}
      - seeds: 20                        # Monte Carlo: `seed` = 0 .. 19
                                         # (or {n: 20, start: 100})
    run:                                 # optional: the flags of `clustersim run`
      fidelity: auto                     # auto | detailed | folded
      max_events: 6e7                    # refuse points estimated above this many events
      max_memory: 8GiB
    report:                              # optional: what `clustersim report DIR` draws
      x: step_time_s                     # Pareto front, both minimised; x defaults to
      y: cost.usd_per_million_tokens     # time_to_train_h with train_tokens, else step_time_s
      train_tokens: 1e12                 # adds time_to_train_h = train_tokens / tokens_per_s
      metrics: [step_time_s, mfu, cost.usd_per_million_tokens]   # sensitivity, distributions

Keys are any dotted scenario key (``--set`` syntax; ``name`` and ``seed`` too).
A key may be varied by one axis only, and not also fixed in ``set``. Unknown
study keys are errors, reported with their key path (exit code 2).

Outputs in the study directory (``--out``, default ``reports/<study name>/``):

- ``study.json``: the study's name, axes and point count (written first; it marks
  the directory as this study's);
- ``points/<id>.json``: one file per finished point, written atomically when it
  finishes: its overrides, axis values, ``status`` (``ok`` or ``failed``), the
  error message of a failed point, and its ``summary.json``;
- ``results.parquet``: one row per point, rebuilt from ``points/`` at the end:
  ``point``, ``index``, the axis values (one column per key), ``status``,
  ``error``, then every ``summary.json`` key flattened (``breakdown_s.compute``;
  lists as JSON text), ``time_to_train_h`` when the study gives
  ``report.train_tokens``, and ``point_wall_s``, the point's time in its worker;
- ``runs/<id>/``: with ``--keep-runs``, each point's ``run`` outputs.

A point's id is a hash of the base scenario, its overrides and the fidelity, so
it is the same whatever the worker count or executor. A rerun skips every point
with a file in ``points/``, failed ones included (``--retry-failed`` runs those
again), except points lost with a Dask worker, which it always retries. With
``--keep-runs`` on an existing Dask cluster the workers write ``runs/``, so the
output directory must be one they share.
"""

from __future__ import annotations

from clustersim.sweep.axes import Point, axis_assignments, expand, point_id
from clustersim.sweep.spec import Study, StudySpec, load_study, parse_study

__all__ = [
    "Point",
    "Study",
    "StudySpec",
    "axis_assignments",
    "expand",
    "load_study",
    "parse_study",
    "point_id",
]
