"""The link table (``links.parquet``) and the link-utilisation figure (``topology.png``)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import simpy
from matplotlib import image as mpimg

from clustersim import catalog
from clustersim.catalog.schema import EfaSpec
from clustersim.cli import main
from clustersim.network.fabric import Topology, build_topology
from clustersim.network.flows import FlowNetwork
from clustersim.report import load_run
from clustersim.report.data import RunData
from clustersim.report.figures import FIGURES, render
from clustersim.report.topology import tier_table, topology
from clustersim.trace.links import LINK_COLUMNS, LINK_TABLE, link_frame

MIN_VARIANCE = 1e-3  # a blank (single-colour) image has variance 0


def _assert_not_blank(png: bytes) -> None:
    assert png.startswith(b"\x89PNG")
    px = np.asarray(mpimg.imread(io.BytesIO(png), format="png"))
    assert px.shape[0] > 300 and px.shape[1] > 600
    assert float(px[..., :3].var()) > MIN_VARIANCE


def _spec() -> Any:
    import clustersim.report.topology  # noqa: F401  (registers the figure)

    return next(s for s in FIGURES if s.name == "topology")


# -- links.parquet from `clustersim run` ----------------------------------------------


def test_run_writes_the_link_table(tiny_run: Path) -> None:
    links = pd.read_parquet(tiny_run / LINK_TABLE)
    assert list(links.columns) == list(LINK_COLUMNS)
    inst, chip = catalog.instance("trn2.48xlarge"), catalog.chip("trn2")
    topo = build_topology(inst, chip, 1)
    assert len(links) == topo.n_links
    assert links["link"].tolist() == topo.names.tolist()
    for col in ("mean_util", "peak_util"):
        values = links[col].to_numpy()
        assert np.isfinite(values).all() and (values >= 0).all() and (values <= 1).all()
    assert (links["peak_util"] >= links["mean_util"] - 1e-12).all()
    assert (links["capacity_Bps"] > 0).all()
    # The tiny run moves bytes over NeuronLink and on chip, and nothing else exists.
    assert set(links["kind"].astype(str)) == {"local", "neuronlink"}
    assert set(links["tier"].astype(str)) == {"local", "torus x", "torus y"}
    assert links.loc[links["kind"] == "neuronlink", "bytes"].sum() > 0
    assert (links.loc[links["bytes"] > 0, "mean_util"] > 0).all()
    # Endpoints are chips of the 4x4 torus, at their coordinates.
    assert ((links["src_chip"] >= 0) & (links["dst_chip"] >= 0)).all()
    assert links[["src_x", "src_y", "dst_x", "dst_y"]].isin(range(4)).all().all()
    assert (links[["src_z", "dst_z", "src_domain", "dst_domain"]] == 0).all().all()
    coords = topo.chip_coords
    assert coords is not None
    chips = links["src_chip"].to_numpy()
    assert (links["src_x"].to_numpy() == coords[chips, 0]).all()
    assert (links["src_y"].to_numpy() == coords[chips, 1]).all()


def test_run_writes_the_topology_figure(tiny_run: Path) -> None:
    assert "topology" in {s.name for s in FIGURES}
    _assert_not_blank((tiny_run / "topology.png").read_bytes())
    page = (tiny_run / "report.html").read_text(encoding="utf-8")
    assert "Link utilisation on the topology" in page
    assert 'href="links.parquet"' in page


def test_report_rebuilds_from_the_saved_link_table(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "rebuilt"
    assert main(["report", str(tiny_run), "--out", str(out), "--no-trace"]) == 0
    _assert_not_blank((out / "topology.png").read_bytes())
    assert load_run(tiny_run, trace=False).links is not None


def test_a_result_directory_without_a_link_table_still_rebuilds(
    tiny_run: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    (old / LINK_TABLE).unlink()
    assert load_run(old, trace=False).links is None
    assert main(["report", str(old), "--no-trace"]) == 0
    assert not (old / "topology.png").exists()  # the stale figure is removed, not kept
    page = (old / "report.html").read_text(encoding="utf-8")
    assert "Link utilisation on the topology" not in page
    assert (old / "timeline.png").is_file()


def test_an_unreadable_link_table_is_a_clean_error(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_run, bad)
    (bad / LINK_TABLE).write_bytes(b"not parquet")
    assert main(["report", str(bad), "--no-trace"]) == 2
    assert LINK_TABLE in capsys.readouterr().err


# -- the figure on other fabrics (synthetic loads, no simulation) ---------------------


def _loaded_table(topo: Topology, pairs: list[tuple[int, int]]) -> pd.DataFrame:
    """The link table after moving 1 GB over each pair (one transfer each, staggered)."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    for i, pair in enumerate(pairs):
        env.process(_later(env, net, pair, 1e-4 * i))
    env.run()
    return link_frame(topo, net.link_utilisation())


def _later(env: simpy.Environment, net: FlowNetwork, pair: tuple[int, int], delay: float) -> Any:
    yield env.timeout(delay)
    yield net.transfer([pair], 1e9, 0.0)


def _run_data(links: pd.DataFrame, *, instances: int, fidelity: str = "detailed") -> RunData:
    summary = {"scenario": "synthetic", "fidelity": fidelity, "instances": instances}
    return RunData(summary, links=links)


def _topo(name: str, count: int, **efa: Any) -> Topology:
    inst = catalog.instance(name)
    if efa:
        fields = {**inst.efa.model_dump(), **efa}
        inst = inst.model_copy(update={"efa": EfaSpec.model_validate(fields)})
    return build_topology(inst, catalog.chip(inst.chip), count)


def test_link_frame_tiers_and_geometry_of_an_ultraserver() -> None:
    topo = _topo("trn2u.48xlarge", 8)  # two UltraServers, joined by EFA
    links = _loaded_table(topo, [(0, 1), (0, 16), (3, 70), (5, 5)])
    tiers = set(links["tier"].astype(str))
    assert {"local", "torus x", "torus y", "torus z", "chip->efa", "efa->chip"} <= tiers
    z = links[links["tier"] == "torus z"]
    assert (z["src_x"] == z["dst_x"]).all() and (z["src_y"] == z["dst_y"]).all()
    assert ((z["src_z"] - z["dst_z"]).abs() % 2 == 1).all()  # neighbours in z (4-ring)
    efa = links[links["kind"] == "efa"]
    up = efa[efa["tier"] == "chip->efa"]
    assert (up["dst_chip"] == -1).all() and (up["dst_x"] == -1).all()
    assert (up["dst_domain"] == -1).all() and (up["src_domain"] >= 0).all()
    assert set(links["src_domain"][links["src_chip"] >= 0]) == {0, 1}
    assert links.loc[links["link"] == "chip0->chip16", "bytes"].iloc[0] > 0


@pytest.mark.parametrize("fidelity", ["detailed", "folded"])
def test_figure_of_a_3d_torus(fidelity: str) -> None:
    topo = _topo("trn2u.48xlarge", 4)
    links = _loaded_table(topo, [(0, 1), (1, 2), (0, 16), (16, 32), (5, 6), (7, 0)])
    data = _run_data(links, instances=4, fidelity=fidelity)
    fig = topology(data)
    assert fig is not None
    titles = [ax.get_title() for ax in fig.axes]
    assert sum(t.startswith("plane z = ") for t in titles) == 4
    assert any(t.startswith("Z rings") for t in titles)
    texts = " ".join(t.get_text() for t in fig.texts)
    assert ("Folded run" in texts) == (fidelity == "folded")
    assert "4x4x4 NeuronLink torus of the UltraServer" in texts
    rendered = render(_spec(), data)
    assert rendered is not None
    _assert_not_blank(rendered.png)


def test_figure_of_a_switch_fabric_with_efa_tiers() -> None:
    topo = _topo("p5.48xlarge", 2, fabric="fat_tree", tiers=3, radix=8)
    links = _loaded_table(topo, [(0, 1), (0, 8), (9, 2), (3, 3)])
    data = _run_data(links, instances=2)
    fig = topology(data)
    assert fig is not None
    titles = " ".join(ax.get_title(loc="left") for ax in fig.axes)
    assert "each chip's links to its switch tier, instance 0 of 2 (the busiest)" in titles
    table = tier_table(links, folded=False)
    order = table["tier"].tolist()
    # On chip, then the scale-up switch, then EFA up the tree and down again.
    assert order[0] == "local"
    assert order.index("chip->switch") < order.index("chip->leaf")
    assert order.index("chip->leaf") < order.index("leaf->spine2") < order.index("spine2->leaf")
    assert order.index("spine2->leaf") < order.index("leaf->chip")
    assert ((table["mean"] >= 0) & (table["mean"] <= table["busiest"] + 1e-12)).all()
    assert (table["peak"] <= 1).all()
    rendered = render(_spec(), data)
    assert rendered is not None
    _assert_not_blank(rendered.png)


def test_folded_tiers_average_the_loaded_links_only() -> None:
    topo = _topo("trn2.48xlarge", 1)
    links = _loaded_table(topo, [(0, 1)])
    x = links[links["tier"] == "torus x"]
    detailed = tier_table(links, folded=False).set_index("tier").loc["torus x"]
    folded = tier_table(links, folded=True).set_index("tier").loc["torus x"]
    assert detailed["mean"] == pytest.approx(x["mean_util"].mean())
    assert folded["mean"] == pytest.approx(x.loc[x["bytes"] > 0, "mean_util"].mean())
    assert folded["loaded"] == 1 and folded["links"] == len(x)


def test_figure_is_skipped_without_a_link_table() -> None:
    summary = {"scenario": "synthetic", "fidelity": "detailed", "instances": 1}
    assert topology(RunData(summary)) is None
    assert topology(RunData(summary, links=pd.DataFrame({"link": ["a"]}))) is None


def test_figure_of_an_imported_graph_without_coordinates() -> None:
    import networkx as nx

    from clustersim.network.graphs import GraphTopology, check_fabric

    g = nx.Graph()
    for i in range(8):
        g.add_node(f"g{i}", instance=0)
        g.add_edge(f"g{i}", f"g{(i + 1) % 8}", capacity_Bps=1e11, latency_s=1e-6)
    g.add_node("hub", kind="switch")
    for i in range(0, 8, 2):
        g.add_edge(f"g{i}", "hub", capacity_Bps=5e10, latency_s=2e-6)
    spec = check_fabric(g, chips_per_instance=8, instances=1, where="cluster.fabric_file")
    topo = GraphTopology(spec, chips_per_instance=8, instances=1, local_bw_Bps=1e12)
    links = _loaded_table(topo, [(0, 1), (0, 4), (2, 6), (3, 3)])
    assert {"chip->chip", "chip->switch", "switch->chip", "local"} == set(links["tier"].astype(str))
    summary = {**_run_data(links, instances=1).summary, "fabric_file": {"path": "ring.json"}}
    data = RunData(summary, links=links)
    fig = topology(data)
    assert fig is not None
    titles = " ".join(ax.get_title(loc="left") for ax in fig.axes)
    assert "the imported fabric graph (the whole graph)" in titles
    rendered = render(_spec(), data)
    assert rendered is not None
    _assert_not_blank(rendered.png)
