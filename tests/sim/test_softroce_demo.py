"""``python -m sim.softroce.demo`` reduced: qp-server in the Soft-RoCE guest against netdev.

Four demos, each with its own netdev and guest boot (about 1 and 1.5 minutes
here, with the Verilator build cached): a clean link, and a link that drops 2 %
and corrupts 0.5 % of the frames both ways, where the endpoint must retransmit
and every byte must still arrive. Both include the close and reopen of one host
QP (``--repeat 2``). The third runs the example event source (``--example``: the
benches' build, the one every cocotb test runs, with its source on): host.read_events
in the guest reads its fragments through the receive API from the ring its OPEN_QP
announced. The fourth runs both ports of the two-cage board (``--ports 2``): the guest
with a second NIC on port 2's channel, two qp-server runs with both endpoints, checked
per port (about 45 s here). The checks of :func:`sim.softroce.demo.check_run` are tested
on their own first, without the guest, so a broken check cannot pass silently.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import pytest

from host.protocol import generator_payload
from sim.netdev import event_core_design
from sim.softroce.demo import (
    CMS,
    DEFAULT_RUNS,
    EXAMPLE_RUNS,
    LISTEN_PORT,
    TWO_PORT_RUNS,
    DemoResult,
    DemoRun,
    RunCheck,
    build_parser,
    check_run,
    example_netdev_options,
    expected_sha256,
    guest_script,
    main,
    port_checks,
    port_totals,
    run_demo,
    simulation_figures,
)
from sim.softroce.image import Image, cached_image
from sim.softroce.tools import HostToolsError, ensure_host_tools
from sim.softroce.vm import ETH1_SETUP_FAILED, QEMU, Guest, GuestConfig, SecondNic

REPEAT = DemoRun(write=True, immediate=True, size=256, count=3, repeat=2)
CLEAN_RUNS = (
    REPEAT,
    DemoRun(write=False, immediate=False, size=3000, count=2, mtu=1024),
    DemoRun(write=True, immediate=False, size=64, count=4, qps=2),
)
FAULT_RUNS = (
    DemoRun(write=True, immediate=False, size=10000, count=12, mtu=1024),
    DemoRun(write=False, immediate=True, size=3000, count=4, mtu=1024),
    REPEAT,
)
FAULTS = "drop=0.02,corrupt=0.005"


def _summary(run: DemoRun, *, status_bytes: int | None = None,
             endpoint_psns: tuple[int, ...] = (0x123, 0x456)) -> dict:
    def one(number: int) -> dict:
        qps = [{"index": index, "endpoint_qpn": 256 + index, "path_mtu": run.mtu or 4096,
                "messages_ok": run.count, "endpoint_psn": endpoint_psns[number - 1],
                "first_error": None,
                "status": {"messages": run.count, "packets": run.count, "retransmitted": 0,
                           "bytes": run.count * run.size if status_bytes is None
                           else status_bytes}}
               for index in range(run.qps)]
        return {"ok": True, "pass": number, "messages": run.count * run.qps,
                "bytes": run.count * run.size * run.qps, "qp": qps, "gbytes_per_s": 0.0}
    passes = [one(number) for number in range(1, run.repeat + 1)]
    return {**passes[-1], "passes": passes} if run.repeat > 1 else passes[0]


def test_check_run_accepts_agreeing_status_and_rejects_the_rest() -> None:
    good = RunCheck(REPEAT, 0, exit_code=0, summary=_summary(REPEAT))
    check_run(good)
    assert good.ok, good.problems
    assert len(good.lines) == 2 and "pass 2/2" in good.lines[1]

    wrong_bytes = RunCheck(REPEAT, 1, exit_code=0, summary=_summary(REPEAT, status_bytes=5))
    check_run(wrong_bytes)
    assert any("STATUS says 5 bytes, expected 3 x 256 = 768" in text
               for text in wrong_bytes.problems), wrong_bytes.problems

    stale = RunCheck(REPEAT, 2, exit_code=0,
                     summary=_summary(REPEAT, endpoint_psns=(0x77, 0x77)))
    check_run(stale)
    assert any("did not hand out a new PSN" in text for text in stale.problems)

    silent = RunCheck(REPEAT, 3, exit_code=1, log=["qp-server: error: no RDMA device"])
    check_run(silent)
    assert silent.problems and "no RDMA device" in silent.problems[0]


def test_guest_script_runs_every_run_with_json() -> None:
    script = guest_script(CLEAN_RUNS)
    assert script.count("python3 -m host.cli --endpoint 10.77.0.2 --timeout 5 --stall 120") == 3
    assert "--write --imm --size 256 --count 3 --repeat 2 --poll hybrid --json" in script
    assert "--send --size 3000 --count 2 --mtu 1024 --poll hybrid --json" in script


RECEIVE_API = DemoRun(write=False, immediate=False, size=4096, count=8, qps=2,
                      receive_api=True)


def _dump_summary(run: DemoRun, *, sha256: str | None = None) -> dict:
    figures = {"messages": run.count, "bytes": run.count * run.size, "seconds": 2.0,
               "retransmitted": 1, "naks": 0, "timeouts": 0}
    qps = [{"index": index, "endpoint_qpn": 256 + index, "bytes": run.count * run.size,
            "sha256": sha256 or expected_sha256(run), "first_error": None,
            "status": {"messages": run.count, "bytes": run.count * run.size,
                       "retransmitted": 1}, "figures": figures}
           for index in range(run.qps)]
    return {"ok": True, "qp": qps,
            "figures": {**figures, "messages": run.count * run.qps,
                        "bytes": run.count * run.size * run.qps, "retransmitted": run.qps}}


def test_the_demo_connects_with_rdma_cm_both_ways() -> None:
    """``make sim`` pairs a run's QP with the guest's rdma_cm connecting to the endpoint,
    and another with the endpoint connecting to the guest's listener; rdma_cm runs are
    single passes, and rdma_connect takes no MTU."""
    by_cm = {run.cm: run for run in DEFAULT_RUNS}
    assert set(by_cm) == set(CMS)
    assert by_cm["rdma"].arguments()[2:4] == ["--cm", "rdma"]
    assert "--listen" not in by_cm["rdma"].arguments()
    argv = by_cm["listen"].arguments()
    assert argv[argv.index("--cm"):argv.index("--cm") + 4] == ["--cm", "rdma", "--listen",
                                                               str(LISTEN_PORT)]
    for bad in ({"cm": "ib"}, {"cm": "rdma", "mtu": 1024}, {"cm": "listen", "repeat": 2}):
        with pytest.raises(ValueError):
            DemoRun(write=True, immediate=False, size=64, count=1, **bad)


def test_the_demo_has_one_receive_api_pass_with_two_qps() -> None:
    assert [run for run in DEFAULT_RUNS if run.receive_api] == [RECEIVE_API]
    script = guest_script([RECEIVE_API])
    assert ("python3 -m host.dump --endpoint 10.77.0.2 --timeout 5 --stall 120 --send "
            "--size 4096 --count 8 --qps 2 --out /tmp/dump-0") in script


def test_check_run_of_the_receive_api_checks_each_file_against_the_golden_model() -> None:
    stream = b"".join(generator_payload(k, 4096) for k in range(8))
    import hashlib

    assert expected_sha256(RECEIVE_API) == hashlib.sha256(stream).hexdigest()
    good = RunCheck(RECEIVE_API, 7, exit_code=0, summary=_dump_summary(RECEIVE_API))
    check_run(good)
    assert good.ok, good.problems
    assert "receive API" in good.lines[0] and "SHA-256 matches" in good.lines[0]
    assert good.retransmitted == 2
    wrong = RunCheck(RECEIVE_API, 7, exit_code=0,
                     summary=_dump_summary(RECEIVE_API, sha256="0" * 64))
    check_run(wrong)
    assert len(wrong.problems) == 2 and "SHA-256" in wrong.problems[0]


def test_simulation_figures_are_labelled_per_run_and_qp() -> None:
    dump = RunCheck(RECEIVE_API, 7, exit_code=0, summary=_dump_summary(RECEIVE_API))
    plain = RunCheck(REPEAT, 0, exit_code=0, summary={
        **_summary(REPEAT), "figures": {"messages": 3, "bytes": 768, "seconds": 0.5,
                                        "retransmitted": 0, "naks": 0, "timeouts": 0}})
    lines = simulation_figures([plain, dump])
    assert lines[0].split()[:3] == ["run", "messages", "bytes"]
    labels = [line.split("  ")[0].strip() for line in lines[1:]]
    assert labels == ["run 0 WRITE+IMM 256 B", "run 7 SEND 4096 B QP 0",
                      "run 7 SEND 4096 B QP 1", "run 7 SEND 4096 B all"]
    assert lines[-1].split()[-9:-6] == ["16", "65536", "2.000000"]


def test_read_events_runs_in_the_guest_against_the_example_source() -> None:
    run, = EXAMPLE_RUNS
    script = guest_script(EXAMPLE_RUNS)
    assert ("python3 -m host.read_events --endpoint 10.77.0.2 --timeout 5 --stall 120 "
            "--size 1000 --slots 8 --count 24 > /tmp/run-0.json") in script
    assert example_netdev_options(run) == ["--source", "example", "--fragment-bytes", "1000",
                                           "--slots", "8", "--events", "24"]
    with pytest.raises(ValueError):
        DemoRun(write=False, immediate=True, size=1000, count=4, slots=8)


def test_check_run_of_read_events_wants_every_fragment_intact() -> None:
    run, = EXAMPLE_RUNS
    good = RunCheck(run, 0, exit_code=0, output="24 of 24 fragments intact, events 0-23, "
                    "timestamps 100-900, 0 errors")
    check_run(good)
    assert good.ok, good.problems
    assert "read_events ok" in good.lines[0]
    for code, output in ((0, "23 of 24 fragments intact, events 0-22, timestamps 1-2, "
                             "0 errors"), (1, "24 of 24 fragments intact, events 0-23, "
                                              "timestamps 1-2, 0 errors"),
                         (0, "24 of 24 fragments intact, events 0-23, timestamps 1-2, "
                             "1 errors"), (0, "")):
        bad = RunCheck(run, 0, exit_code=code, output=output)
        check_run(bad)
        assert len(bad.problems) == 1, output


# Two ports


def test_two_port_script_gives_each_run_both_endpoints_each_on_its_device() -> None:
    script = guest_script(TWO_PORT_RUNS, ports=2)
    both = ("python3 -m host.cli --endpoint 10.77.0.2 --endpoint 10.77.1.2 --device rxe0 "
            "--device rxe1 --timeout 5 --stall 120 ")
    assert script.count(both) == len(TWO_PORT_RUNS) == 3
    assert both + "--write --imm --size 3000 --count 4 --mtu 1024 --poll hybrid --json" in script
    assert guest_script(TWO_PORT_RUNS).count("--endpoint") == 3, "one port: one endpoint"
    with pytest.raises(ValueError, match="qp-server only"):
        guest_script([RECEIVE_API], ports=2)
    with pytest.raises(ValueError):
        guest_script(TWO_PORT_RUNS, ports=3)


def _fleet(run: DemoRun, *, second_ok: bool = True) -> dict:
    first, second = _summary(run), _summary(run, status_bytes=None if second_ok else 7)
    second["ok"] = second_ok
    return {"ok": second_ok, "figures": {},
            "endpoints": [{"endpoint": "10.77.0.2", "error": None, **first},
                          {"endpoint": "10.77.1.2", "error": None, **second}]}


def test_port_checks_check_each_port_on_its_own() -> None:
    run = TWO_PORT_RUNS[1]
    log = ["qp-server: 10.77.0.2: paired host QPN 17", "qp-server: 10.77.1.2: paired 18"]
    good = port_checks(RunCheck(run, 1, exit_code=0, summary=_fleet(run), log=log))
    for check in good:
        check_run(check)
    assert [(check.port, check.ok, check.log) for check in good] == [
        (1, True, log[:1]), (2, True, log[1:])]
    assert good[1].lines[0].startswith("port 2  WRITE+IMM")
    totals = port_totals(good)
    assert totals[0] == ("port 1 (10.77.0.2): 1 of 1 runs ok, 4 messages, 12000 bytes, every "
                         "byte checked and every STATUS agreeing")
    assert totals[2].startswith("both ports: 2 of 2 runs ok, 8 messages, 24000 bytes")

    bad = port_checks(RunCheck(run, 1, exit_code=1, summary=_fleet(run, second_ok=False)))
    for check in bad:
        check_run(check)
    assert bad[0].ok, bad[0].problems
    assert any("on port 2 (10.77.1.2)" in text and "STATUS says 7 bytes" in text
               for text in bad[1].problems), bad[1].problems
    assert port_totals(bad)[2] == "both ports: 1 of 2 runs ok, 8 messages, 24000 bytes"

    missing = port_checks(RunCheck(run, 1, exit_code=124, summary=None))
    for check in missing:
        check_run(check)
    assert all("no JSON summary" in check.problems[0] for check in missing)


def test_two_port_options() -> None:
    args = build_parser().parse_args(["--ports", "2"])
    assert (args.ports, args.local_port2, args.remote_port2) == (2, 17302, 17303)
    for clash in (["--ports", "2", "--quick"], ["--ports", "2", "--example"]):
        with pytest.raises(SystemExit) as exit_info:
            main(clash)
        assert exit_info.value.code == 2


def test_guest_with_a_second_nic(tmp_path) -> None:
    eth1 = SecondNic(local_port=4002, remote_port=4003, neighbour=("10.77.1.2",
                                                                   "02:00:00:00:01:02"))
    config = GuestConfig(local_port=4000, remote_port=4001, eth1=eth1)
    assert config.environment()["SOFTROCE_IP1"] == "10.77.1.1/24"
    assert "SOFTROCE_IP1" not in GuestConfig().environment()
    script = config.script("echo hello\n")
    assert script.startswith("#!/bin/sh\nip link set eth1 mtu \"$SOFTROCE_MTU\" up || ")
    assert script.endswith("echo hello\n")
    for step in ("ip addr add 10.77.1.1/24 dev eth1",
                 "ip neigh replace 10.77.1.2 lladdr 02:00:00:00:01:02 dev eth1 nud permanent",
                 "rdma link add rxe1 type rxe netdev eth1"):
        assert f"\n{step} || {{ echo " in script and f"exit {ETH1_SETUP_FAILED}; }}" in script
    assert GuestConfig().script("echo hello\n") == "echo hello\n"
    for bad in ({"ip": "10.77.0.9/24"}, {"ip": "10.77.0.9/16"}, {"local_port": 4001},
                {"mac": "52:54:00:12:34:56"}):
        with pytest.raises(ValueError):
            GuestConfig(local_port=4000, remote_port=4001,
                        eth1=SecondNic(**{"local_port": 4002, "remote_port": 4003, **bad}))
    with pytest.raises(ValueError):
        SecondNic(ip="10.77.1.1")
    try:
        ensure_host_tools(needed=(QEMU,))
    except HostToolsError as error:
        pytest.skip(f"QEMU's command line: {error}")
    command = Guest("true", config).command(Image(tmp_path), tmp_path)
    netdevs = [command[i + 1] for i, word in enumerate(command) if word == "-netdev"]
    devices = [command[i + 1] for i, word in enumerate(command) if word == "-device"]
    assert [netdev.split(",")[0] for netdev in netdevs] == ["dgram", "dgram"]
    assert "id=n1," in netdevs[1] and "local.port=4002," in netdevs[1]
    assert netdevs[1].endswith("remote.port=4003")
    assert devices == ["virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,romfile=",
                       "virtio-net-pci,netdev=n1,mac=52:54:00:12:34:57,romfile="]
    one = Guest("true", GuestConfig()).command(Image(tmp_path), tmp_path)
    assert one.count("-netdev") == 1 and one.count("-device") == 1


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _demo(runs: tuple[DemoRun, ...], name: str, faults: tuple[str, ...] = (),
          netdev_options: tuple[str, ...] = (), build: Callable[[], object] | None = None,
          two_ports: bool = False) -> DemoResult:
    """Run the demo; ``build`` first builds netdev's design, without netdev's start-up
    limit."""
    try:
        ensure_host_tools(needed=(QEMU,))
    except HostToolsError as error:
        pytest.skip(f"Soft-RoCE demo: {error}")
    if cached_image() is None and os.geteuid() != 0:
        pytest.skip("Soft-RoCE demo: no cached image and building one needs root: run "
                    "`python -m sim.softroce.guest build` as root once")
    if build is not None:
        build()
    started = time.monotonic()
    result = run_demo(runs, faults=faults, local_port=_free_udp_port(),
                      remote_port=_free_udp_port(), require_retransmissions=bool(faults),
                      out=print, name=name, guest_timeout=600,
                      netdev_options=netdev_options,
                      port2=(_free_udp_port(), _free_udp_port()) if two_ports else None)
    print(f"\nSoft-RoCE demo {name}: {time.monotonic() - started:.1f} s")
    return result


@pytest.fixture(scope="module")
def clean() -> DemoResult:
    return _demo(CLEAN_RUNS, "test-demo")


@pytest.fixture(scope="module")
def faulty() -> DemoResult:
    return _demo(FAULT_RUNS, "test-demo-faults", ("--faults", FAULTS))


@pytest.fixture(scope="module")
def example() -> DemoResult:
    run, = EXAMPLE_RUNS
    return _demo(EXAMPLE_RUNS, "test-demo-example",
                 netdev_options=tuple(example_netdev_options(run)),
                 build=lambda: event_core_design(run.size))    # the benches' build


#: The two-port case: a WRITE+IMM of three packets and a SEND of one, each on both ports.
DUAL_RUNS = (
    DemoRun(write=True, immediate=True, size=3000, count=2, mtu=1024),
    DemoRun(write=False, immediate=False, size=256, count=3),
)


@pytest.fixture(scope="module")
def dual() -> DemoResult:
    return _demo(DUAL_RUNS, "test-demo-ports2", two_ports=True)


def _assert_every_message_and_status(result: DemoResult) -> None:
    assert result.ok, "\n".join(result.problems)
    for check in result.checks:
        run = check.run
        assert check.exit_code == 0 and check.summary is not None, check.log
        passes = check.summary.get("passes") or [check.summary]
        assert len(passes) == run.repeat
        for one in passes:
            assert one["ok"] is True
            assert one["messages"] == run.count * run.qps
            assert one["bytes"] == run.count * run.size * run.qps
            assert len(one["qp"]) == run.qps
            for qp in one["qp"]:
                assert qp["messages_ok"] == run.count
                assert qp["status"]["messages"] == run.count
                assert qp["status"]["bytes"] == run.count * run.size
                assert qp["status"]["error"] is False and qp["status"]["outstanding"] == 0
                assert qp["path_mtu"] == (run.mtu or 4096)


def _assert_reopened(result: DemoResult) -> None:
    check = next(check for check in result.checks if check.run == REPEAT)
    assert check.summary is not None
    first, second = check.summary["passes"]
    assert first["qp"][0]["host_qpn"] == second["qp"][0]["host_qpn"], "the same host QP"
    assert first["qp"][0]["host_psn"] != second["qp"][0]["host_psn"]
    assert first["qp"][0]["endpoint_psn"] != second["qp"][0]["endpoint_psn"]
    assert second["qp"][0]["status"]["runs"] == 1, "the reopened QP's counters start anew"
    assert any("closed endpoint QPN" in line for line in check.log)


@pytest.mark.softroce
def test_clean_link_every_byte_and_status(clean: DemoResult) -> None:
    _assert_every_message_and_status(clean)
    assert clean.netdev is not None
    assert clean.netdev["frames"]["to_core"] > 0 and clean.netdev["frames"]["to_host"] > 0
    assert clean.netdev["counters"]["cm.opened"] == 5   # 1 + 1 (repeat) + 1 + 2 QPs


@pytest.mark.softroce
def test_clean_link_reopen_takes_a_new_psn(clean: DemoResult) -> None:
    _assert_reopened(clean)


@pytest.mark.softroce
def test_faulty_link_retransmits_and_stays_byte_exact(faulty: DemoResult) -> None:
    _assert_every_message_and_status(faulty)
    assert faulty.netdev is not None
    faults = [faulty.netdev["faults_to_core"], faulty.netdev["faults_to_host"]]
    assert sum(side["dropped"] + side["corrupted"] for side in faults) > 0
    retransmitted = sum(qp["status"]["retransmitted"]
                        for check in faulty.checks if check.summary
                        for one in (check.summary.get("passes") or [check.summary])
                        for qp in one["qp"])
    assert retransmitted > 0


@pytest.mark.softroce
def test_faulty_link_reopen_takes_a_new_psn(faulty: DemoResult) -> None:
    _assert_reopened(faulty)


@pytest.mark.softroce
def test_read_events_gets_every_fragment_of_the_example_source(example: DemoResult) -> None:
    """The source took the ring's address from the host's OPEN_QP: every fragment landed
    where the receive API registered its buffer, each checked by host.fragments."""
    assert example.ok, "\n".join(example.problems)
    check, = example.checks
    run = check.run
    assert check.exit_code == 0
    assert check.output.startswith(f"{run.count} of {run.count} fragments intact"), check.log
    assert example.netdev is not None
    source = example.netdev["source"]
    assert (source["completed"], source["failed"]) == (run.count, 0), source
    assert example.netdev["counters"]["cm.opened"] == 1
    assert example.netdev["counters"]["cm.closed"] == 1


@pytest.mark.softroce
def test_two_ports_every_byte_and_status_per_port(dual: DemoResult) -> None:
    """Each run's QP on port 1 (10.77.0.2, the guest's rxe0) and on port 2 (10.77.1.2,
    rxe1): byte-exact and its STATUS agreeing, each port's core on its own channel."""
    _assert_every_message_and_status(dual)
    assert [(check.number, check.port) for check in dual.checks] == [
        (0, 1), (0, 2), (1, 1), (1, 2)]
    for check in dual.checks:
        assert check.summary is not None
        assert (check.summary["device"], check.summary["host_ip"]) == (
            ("rxe0", "10.77.0.1") if check.port == 1 else ("rxe1", "10.77.1.1"))
    for summary in (dual.netdev, dual.netdev2):
        assert summary is not None
        assert summary["frames"]["to_core"] > 0 and summary["frames"]["to_host"] > 0
        assert summary["counters"]["cm.opened"] == len(DUAL_RUNS)
