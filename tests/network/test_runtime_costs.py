"""The runtimes' fixed costs, NCCL's choice of algorithm and protocol, and the DMA paths."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import simpy

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.network import Network
from clustersim.network.collectives import GroupInfo, Step, collective_steps
from clustersim.network.fabric import build_topology, local_path
from clustersim.network.flows import FlowNetwork
from clustersim.network.microbench import run_collective
from clustersim.network.runtimes import (
    NcclRuntime,
    NeuronRuntime,
    Protocol,
    nccl_tables,
    neuron_protocol,
    runtime_of,
)

US = 1e-6
MIB = 2.0**20


def _elapsed(env: simpy.Environment, event: simpy.Event) -> float:
    env.run(until=event)
    return float(env.now)


def test_round_costs_closed_form() -> None:
    proto = Protocol(launch_s=0, step_s=10 * US, net_step_s=30 * US, message_s=2 * US)
    mesh = np.asarray([(i, j) for i in range(4) for j in range(4) if i != j])
    inside = np.zeros(len(mesh), dtype=bool)
    # a mesh round: one handshake, then three messages posted one after another
    step = Step(tuple(map(tuple, mesh)), 1.0)
    assert proto.step_latency_s(step, mesh, inside, 1 * US) == pytest.approx((1 + 10 + 3 * 2) * US)
    ring = np.asarray([(i, (i + 1) % 4) for i in range(4)])
    across = np.asarray([False, True, False, True])  # half the pairs cross domains
    repeated = Step(tuple(map(tuple, ring)), 1.0, 6)
    expected = 6 * (1 * US + 0.5 * 10 * US + 0.5 * 30 * US + 2 * US)
    assert proto.step_latency_s(repeated, ring, across, 1 * US) == pytest.approx(expected)
    # a ring's rounds stream over fixed peers, and each still pays its handshake: what any
    # round pays (NCCL), or the ring's own (Neuron)
    streamed = Step(tuple(map(tuple, ring)), 1.0, 6, pipelined=True)
    assert proto.step_latency_s(streamed, ring, across, 1 * US) == pytest.approx(expected)
    neuron = replace(proto, ring_step_s=4 * US)
    ring_s = 6 * (1 * US + 4 * US + 2 * US)
    assert neuron.step_latency_s(streamed, ring, across, 1 * US) == pytest.approx(ring_s)
    assert neuron.step_latency_s(repeated, ring, across, 1 * US) == pytest.approx(expected)


def test_a_collective_costs_its_launch_rounds_and_wire() -> None:
    """Four chips in a row of a Trn2 torus, ring all-gather of 64 MiB, uncontended."""
    chip, inst = catalog.chip("trn2"), catalog.instance("trn2.48xlarge")
    topo = build_topology(inst, chip, 1)
    proto = neuron_protocol(chip)
    ranks = [0, 1, 2, 3]
    env = simpy.Environment()
    net = Network(
        env, topo, list(range(16)), {"all_gather": "ring_uni"}, runtime=NeuronRuntime(proto)
    )
    t = _elapsed(env, net.collective("all_gather", ranks, 64 * MIB))
    a, bw = inst.fabric.link_latency_s, inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    wire = 3 * a + 3 / 4 * 64 * MIB / bw
    rounds = 3 * (proto.ring_step_s + proto.message_s)  # one message to the successor a round
    assert t == pytest.approx(proto.launch_s + rounds + wire, rel=1e-9)


def test_halving_doubling_messages_are_bound_by_their_dma_queues() -> None:
    """One message of a round that is not pipelined moves through a few DMA engines,
    and reduces at half their copy rate before NeuronCore-v4."""
    chip = catalog.chip("trn2")
    proto = neuron_protocol(chip)
    copy = chip.collectives.message_engines * chip.dma_engine_Bps
    assert proto.message_cap_Bps(pipelined=False, reduces=False) == pytest.approx(copy)
    assert proto.message_cap_Bps(pipelined=False, reduces=True) == pytest.approx(copy / 2)
    assert proto.message_cap_Bps(pipelined=True, reduces=True) == math.inf
    trn3 = neuron_protocol(catalog.chip("trn3"))
    assert trn3.message_cap_Bps(pipelined=False, reduces=True) == trn3.message_cap_Bps(
        pipelined=False, reduces=False
    )


def test_a_capped_group_runs_at_its_cap() -> None:
    topo = build_topology(catalog.instance("trn2.48xlarge"), catalog.chip("trn2"), 1)
    env = simpy.Environment()
    flows = FlowNetwork(env, topo)
    group = flows.group(((0, 1),))
    from dataclasses import replace

    capped = replace(group, rate_cap_Bps=10e9)
    done = [flows.transfer_group(capped, 1e9, 0.0), flows.transfer_group(group, 1e9, 0.0)]
    env.run(until=env.all_of(done))
    link = float(topo.capacity_Bps[group.links[0]])
    # the capped flow takes 10 GB/s; the other the rest of the link, then all of it
    t_capped = 1e9 / 10e9
    assert done[0].processed and env.now == pytest.approx(max(t_capped, 2e9 / link), rel=1e-9)


def test_two_ranks_on_one_chip_move_through_dma_and_hbm() -> None:
    """Two ranks of one Trn1 chip: the local path is a DMA copy through HBM."""
    chip = catalog.chip("trn1")
    capacity, latency = local_path(chip)
    assert capacity == pytest.approx(min(chip.dma_bw_Bps, chip.hbm_bw_Bps * 0.85 / 2))
    assert latency == chip.dma_setup_s > 0
    (row,) = run_collective(
        "trn1.32xlarge", 1, "all_reduce", [2.0**30], algorithm="ring", ranks=2, lnc=1
    )
    # ring over two ranks: two rounds of half the buffer each way, both directions on
    # the one chip's DMA path, then the runtime's costs
    proto = neuron_protocol(chip)
    wire = 2 * (latency + 2.0**30 / 2 / (capacity / 2))
    rounds = 2 * (proto.ring_step_s + proto.message_s)
    assert row["time_s"] == pytest.approx(wire + proto.launch_s + rounds, rel=1e-6)
    assert row["busbw_GBps"] < 200


# -- NCCL ------------------------------------------------------------------------------------


def _nccl(nvls: bool = True) -> NcclRuntime:
    return NcclRuntime(
        intra_Bps=360e9, inter_Bps=40e9, net_latency_s=15 * US, nvls=nvls, nvls_efficiency=0.76
    )


def _nodes(nodes: int, per_node: int) -> GroupInfo:
    p = nodes * per_node
    return GroupInfo(tuple(range(p)), tuple(i // per_node for i in range(p)), (), ())


def test_nccl_ring_latency_by_hand() -> None:
    """Ring LL over 8 ranks of one node: base + 2(p-1) NVLink hops (tuning model)."""
    t = nccl_tables()
    rt = _nccl()
    info = _nodes(1, 8)
    want = (t.base_us["ring"]["LL"] + 14 * t.intra_hop_us["ring"]["LL"]) * US
    assert rt.predict_s("all_reduce", 8, 0.0, info, ("ring", "LL")) == pytest.approx(want)
    two = _nodes(2, 8)
    net = (t.net_hop_us["ring"]["LL"] + t.net_post_us) * US + 15 * US
    want = (t.base_us["ring"]["LL"] + 28 * t.intra_hop_us["ring"]["LL"]) * US + 2 * net
    assert rt.predict_s("all_reduce", 16, 0.0, two, ("ring", "LL")) == pytest.approx(want)


def test_nccl_choice_changes_with_size_and_nodes() -> None:
    rt = _nccl()
    one, two = _nodes(1, 8), _nodes(2, 8)
    assert rt.choose("all_reduce", 8, 8.0, one, "auto")[0] == "ring"
    assert rt.choose("all_reduce", 8, 8.0, one, "auto")[1].name == "LL"
    assert rt.choose("all_reduce", 8, 2.0**30, one, "auto")[0] == "nvls"
    assert _nccl(nvls=False).choose("all_reduce", 8, 2.0**30, one, "auto")[0] == "ring"
    big = rt.choose("all_reduce", 8, 2.0**30, one, "ring")
    assert big[0] == "ring" and big[1].name == "Simple"
    # across two nodes the tree beats a ring bound by one NIC a rank
    assert rt.choose("all_reduce", 16, 2.0**30, two, "auto")[0] == "double_tree"
    assert rt.choose("all_gather", 16, 2.0**30, two, "auto")[0] == "ring_channels"
    with pytest.raises(ScenarioError, match=r"cluster\.collectives\.all_reduce"):
        _nccl(nvls=False).choose("all_reduce", 8, 1.0, one, "nvls")


def test_nccl_rows_name_algorithm_and_protocol() -> None:
    rows = run_collective("p5.48xlarge", 1, "all_reduce", [8, 2.0**31])
    assert [(r["algorithm"], r["protocol"]) for r in rows] == [("ring", "LL"), ("nvls", "Simple")]
    # NVLS at large sizes: about 480 GB/s busbw on 8 x H100 (nccl-tests)
    assert rows[1]["busbw_GBps"] == pytest.approx(480, rel=0.05)


def test_double_tree_carries_the_buffer_twice_over_every_chain_edge() -> None:
    """NCCL's tree streams the reduce and the broadcast at once (runTreeSplit): one
    pipelined step, its chunks travelling the chain and the trees up and down."""
    (step,) = collective_steps("all_reduce", 8, 16.0, "double_tree", _nodes(2, 4))
    assert step.reduces and step.pipelined and step.hops == (6, 2)
    sent = [0.0] * 8
    across = [0.0] * 8
    for a, b in step.pairs:
        if a // 4 == b // 4:
            sent[a] += step.bytes_per_flow
        else:
            across[a] += step.bytes_per_flow
    # every rank sends 3/4 of the buffer up its chains and 3/4 down (4 rotations, two
    # trees each); its NIC carries a half-shard up one tree and one down the other
    assert sent == pytest.approx([16.0 * 3 / 4 * 2] * 8)
    assert across == pytest.approx([2 * 16.0 / 4 / 2] * 8)


@pytest.mark.parametrize(("nodes", "sends"), [(2, 2), (3, 3), (4, 3), (5, 4), (8, 4), (64, 4)])
def test_double_tree_nics_carry_a_half_shard_per_tree_edge(nodes: int, sends: int) -> None:
    """Across nodes of one rank each, a NIC carries each way a half of the buffer per
    tree edge its node ends in, over both mirrored trees: the root of a heap over four
    nodes 3 (two children in one tree, a parent in the mirror), an inner node of a
    larger heap 4. Phase after phase, that root would take 4 (2 each phase)."""
    from clustersim.network.collectives import tree_sends

    assert tree_sends(nodes) == sends
    (step,) = collective_steps("all_reduce", nodes, 2.0, "double_tree", _nodes(nodes, 1))
    out = [0.0] * nodes
    into = [0.0] * nodes
    for a, b in step.pairs:
        out[a] += step.bytes_per_flow
        into[b] += step.bytes_per_flow
    assert max(out) == max(into) == pytest.approx(sends * 2.0 / 2)


def test_double_tree_on_four_p5_closed_form() -> None:
    """4 x p5.48xlarge, 1 GiB: the NICs carry 3 half-shards of n / 8 each way (196 GB/s
    algbw after Simple's 0.92), the chains 2 x 7/8 n (189 GB/s): NVLink binds, where
    one phase after the other the NICs bound it at 147 GB/s."""
    n = 2.0**30
    (row,) = run_collective("p5.48xlarge", 4, "all_reduce", [n])
    assert (row["algorithm"], row["protocol"]) == ("double_tree", "Simple")
    chip, inst = catalog.chip("h100"), catalog.instance("p5.48xlarge")
    nic = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    nvlink = inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    wire = max(2 * 7 / 8 * n / nvlink, 3 * n / 16 / nic) / 0.92
    rt = runtime_of(chip, inst)
    latency = rt.predict_s("all_reduce", 32, 0.0, _nodes(4, 8), ("double_tree", "Simple"))
    assert row["time_s"] == pytest.approx(latency + wire, rel=2e-3)


def test_neuron_refuses_nvls() -> None:
    with pytest.raises(ScenarioError, match="NCCL"):
        NeuronRuntime().choose("all_reduce", 4, 1.0, GroupInfo.flat(4), "nvls")


def test_a_forced_protocol_runs_and_bad_ones_are_refused() -> None:
    rows = run_collective("p5.48xlarge", 1, "all_reduce", [2.0**30], protocol="ll")
    assert (rows[0]["algorithm"], rows[0]["protocol"]) == ("ring", "LL")
    simple = run_collective("p5.48xlarge", 1, "all_reduce", [2.0**30], algorithm="ring")
    # LL puts a flag beside every 4 bytes of data: half the bandwidth
    assert rows[0]["busbw_GBps"] == pytest.approx(simple[0]["busbw_GBps"] / 2, rel=0.02)
    with pytest.raises(ScenarioError, match="protocol: unknown NCCL protocol"):
        run_collective("p5.48xlarge", 1, "all_reduce", [1.0], protocol="LL256")
    with pytest.raises(ScenarioError, match="only NCCL"):
        run_collective("trn2.48xlarge", 1, "all_reduce", [1.0], protocol="Simple")


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (["--protocol", "LL64"], "--protocol"),
        (["--algorithm", "butterfly"], "--algorithm"),
    ],
)
def test_collective_bad_input_exits_2(
    args: list[str], path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from clustersim.cli import main

    base = ["collective", "--instance", "p5.48xlarge", "--op", "all_reduce", "--size", "1MiB"]
    code = main([*base, *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"clustersim: error: {path}") and "Traceback" not in err


def test_a_fabric_whose_radix_cannot_hold_the_cluster_exits_2(tmp_path: object) -> None:
    from pathlib import Path

    from clustersim.cli import main

    scenario = Path(str(tmp_path)) / "big.yaml"
    scenario.write_text(
        "name: big\\ncluster: {instance: p5.48xlarge, count: 64, "
        "efa: {fabric: fat_tree, tiers: 2, radix: 8}}\\nmodel: llama3-8b\\n"
        "parallelism: {tp: 8}\\ntraining: {seq_len: 1024, global_batch_size: 64}\\n"
    )
    assert main(["check", str(scenario)]) == 2


def test_nccl_runs_no_ll128_across_nodes_unless_forced() -> None:
    """Across EFA NCCL's defaults are LL and Simple (catalog/runtimes.yaml); inside a node
    LL128 stays a candidate, and NCCL_PROTO=LL128 forces it anywhere."""
    assert nccl_tables().network_protocols == ("LL", "Simple")
    rt = _nccl(nvls=False)
    one, two = _nodes(1, 8), _nodes(2, 8)
    assert {p for _, p in rt.candidates("all_reduce", two)} == {"LL", "Simple"}
    assert "LL128" in {p for _, p in rt.candidates("all_reduce", one)}
    algo, proto = rt.choose("all_reduce", 16, 8 * MIB, two, "auto")
    assert (algo, proto.name) == ("double_tree", "Simple")
    # tree Simple by hand: base + 2 (7 NVLink hops + one network hop, route twice)
    t = nccl_tables()
    net = (t.net_hop_us["tree"]["Simple"] + 3 * t.net_post_us) * US + 2 * 15 * US
    latency = t.base_us["tree"]["Simple"] * US + 2 * (
        7 * t.intra_hop_us["tree"]["Simple"] * US + net
    )
    want = latency + 8 * MIB / (360e9 * 0.92 * 0.5)
    assert rt.predict_s("all_reduce", 16, 8 * MIB, two, (algo, "Simple")) == pytest.approx(want)
    assert rt.choose("all_reduce", 16, 8 * MIB, two, "double_tree")[1].name == "Simple"
    forced = replace(rt, only_protocol="LL128").choose("all_reduce", 16, 8 * MIB, two, "auto")
    assert (forced[0], forced[1].name) == ("double_tree", "LL128")


def test_nvls_tree_loads_and_its_closed_form() -> None:
    """NVLS-tree over 2 nodes of 4: every rank's switch link carries n each way, its
    NIC n / L each way. The switch's efficiency (NVLS's) bounds the flows through it
    alone; the NICs run at their own rate. On 2 x p5 the switch binds, as on one node;
    on 4 the NICs do: the root of a heap over 4 nodes sends its shard's half to two
    children in one tree and to its parent in the mirror, 1.5 shards."""
    (step,) = collective_steps("all_reduce", 8, 16.0, "nvls_tree", _nodes(2, 4))
    assert step.pipelined and step.reduces and step.hops == (1, 2)
    sent: dict[tuple[int, bool], float] = {}
    for a, b in step.pairs:
        key = (a, a // 4 != b // 4)
        sent[key] = sent.get(key, 0.0) + step.bytes_per_flow
    assert [sent[(r, False)] for r in range(8)] == pytest.approx([16.0] * 8)
    assert [sent[(r, True)] for r in range(8)] == pytest.approx([16.0 / 4] * 8)
    n = 2.0**34
    chip, inst = catalog.chip("h100"), catalog.instance("p5.48xlarge")
    nic = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    switch = inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    switch *= chip.collectives.nvls_efficiency
    t = nccl_tables()
    net = (t.net_hop_us["nvls_tree"]["Simple"] + 3 * t.net_post_us) * US + 2 * inst.efa.latency_s
    for nodes, shards in ((2, 1.0), (4, 1.5)):
        (row,) = run_collective("p5.48xlarge", nodes, "all_reduce", [n], algorithm="nvls_tree")
        assert (row["algorithm"], row["protocol"]) == ("nvls_tree", "Simple")
        latency = t.intra_hop_us["nvls_tree"]["Simple"] * US + 2 * math.log2(nodes) * net
        wire = max(n / switch, shards * n / 8 / nic)
        assert row["time_s"] == pytest.approx(latency + wire, rel=1e-3)
    # 2 nodes: bound by the switch, not the NICs (busbw 512 GB/s; measured 487 at 16 GiB)
    assert n / switch > n / 8 / nic
    # auto keeps the tree: the tuning tables would pick NVLS-tree from a few MB
    (auto,) = run_collective("p5.48xlarge", 2, "all_reduce", [n])
    assert auto["algorithm"] == "double_tree"
    (one,) = run_collective("p5.48xlarge", 1, "all_reduce", [n], algorithm="nvls_tree")
    assert one["algorithm"] == "nvls"
    with pytest.raises(ScenarioError, match="NCCL"):
        NeuronRuntime().choose("all_reduce", 4, 1.0, GroupInfo.flat(4), "nvls_tree")


def test_nvls_tree_tuning_prices_the_switch_and_the_nics_apart() -> None:
    """NCCL's tuning model: NVLS-tree's bandwidth is the smaller of the switch's share
    (NVLink x NVLS's efficiency) and the node's NICs (halved beyond two nodes), x 5/6."""
    rt = _nccl()
    for nodes, nics in ((2, 8 * 40e9), (4, 8 * 40e9 / 2)):
        info = _nodes(nodes, 8)
        zero = rt.predict_s("all_reduce", 8 * nodes, 0.0, info, ("nvls_tree", "Simple"))
        n = 2.0**30
        got = rt.predict_s("all_reduce", 8 * nodes, n, info, ("nvls_tree", "Simple"))
        assert got - zero == pytest.approx(n / (min(360e9 * 0.76, nics) * 0.8333))


def test_no_bandwidth_makes_the_tuning_model_turn_from_tree_to_nvls_tree() -> None:
    """On 2 nodes of 8 the tables put NVLS-tree's latency 39.4 us below tree Simple's
    (8.4 + 2 x 7 x 4.0 - 25), whatever the network's latency: the network hops are the
    same 2 log2(2) on both. So with time = latency + size / bandwidth, wherever
    NVLS-tree beats the tree it beats it at every smaller size too."""
    two = _nodes(2, 8)
    for net_s in (0.0, 15 * US, 100 * US):
        rt = replace(_nccl(), net_latency_s=net_s)
        tree = rt.predict_s("all_reduce", 16, 0.0, two, ("double_tree", "Simple"))
        nvls_tree = rt.predict_s("all_reduce", 16, 0.0, two, ("nvls_tree", "Simple"))
        assert tree - nvls_tree == pytest.approx(39.4 * US)
    # with any pair of bandwidths, the sign of the difference changes at most once,
    # from NVLS-tree faster (small sizes) to the tree faster (large ones)
    for intra, inter in ((360e9, 40e9), (360e9, 10e9), (900e9, 100e9)):
        rt = replace(_nccl(), intra_Bps=intra, inter_Bps=inter)
        faster = [
            rt.predict_s("all_reduce", 16, n, two, ("nvls_tree", "Simple"))
            < rt.predict_s("all_reduce", 16, n, two, ("double_tree", "Simple"))
            for n in (2.0**k for k in range(3, 36))
        ]
        assert faster[0] and faster == sorted(faster, reverse=True)


def test_nccl_rings_across_nodes_spread_over_every_nic() -> None:
    """All-gather over 2 nodes of 4: a ring per rank of a node, each rank leaving its
    node on one of them; on 2 x p5 the NICs' share binds, 8 NICs' worth of busbw."""
    (step,) = collective_steps("all_gather", 8, 32.0, "ring_channels", _nodes(2, 4))
    assert step.repeats == 7 and step.pipelined
    leaving = [sum(1 for a, b in step.pairs if a == r and a // 4 != b // 4) for r in range(8)]
    assert leaving == [1] * 8
    assert len(step.pairs) == 4 * 8 and step.bytes_per_flow == pytest.approx(32.0 / 4 / 8)
    n = 2.0**30
    (row,) = run_collective("p5.48xlarge", 2, "all_gather", [n])
    assert (row["algorithm"], row["protocol"]) == ("ring_channels", "Simple")
    chip, inst = catalog.chip("h100"), catalog.instance("p5.48xlarge")
    nic = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    # busbw of the wire alone is 8 NICs; the ring's 15 hop latencies come on top
    assert row["busbw_GBps"] == pytest.approx(8 * nic / 1e9, rel=0.05)
    assert row["busbw_GBps"] < 8 * nic / 1e9
    # all-reduce keeps NCCL's tree across nodes; one rank a node keeps the plain ring
    assert run_collective("p5.48xlarge", 2, "all_reduce", [n])[0]["algorithm"] == "double_tree"
    rt = _nccl()
    assert rt.choose("all_gather", 2, n, _nodes(2, 1), "auto")[0] == "ring"


def test_buckets_of_other_sizes_share_the_capped_groups_of_their_steps() -> None:
    """Collectives over one group that differ only in size (the gradient buckets of a
    stage) run their steps on the same routed groups, capped alike: the solve memo, the
    link statistics and the HBM variants see one group per step, not one per bucket."""
    chip, inst = catalog.chip("trn2"), catalog.instance("trn2.48xlarge")
    topo = build_topology(inst, chip, 1)
    proto = neuron_protocol(chip)
    env = simpy.Environment()
    net = Network(
        env,
        topo,
        list(range(16)),
        {"all_gather": "halving_doubling"},
        runtime=NeuronRuntime(proto),
    )
    ranks = (0, 1, 2, 3)
    small = net._plan("all_gather", ranks, 1 * MIB, None)
    large = net._plan("all_gather", ranks, 3 * MIB, None)
    assert len(small) == len(large) == 2
    cap = proto.message_cap_Bps(pipelined=False, reduces=False)
    for (a, bytes_a, _), (b, bytes_b, _) in zip(small, large, strict=True):
        assert a is b and a.rate_cap_Bps == cap
        assert bytes_b == pytest.approx(3 * bytes_a)
