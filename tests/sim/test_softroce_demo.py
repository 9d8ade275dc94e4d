"""``python -m sim.softroce.demo`` reduced: qp-server in the Soft-RoCE guest against netdev.

Three demos, each with its own netdev and guest boot (about 1 and 1.5 minutes
here, with the Verilator build cached): a clean link, and a link that drops 2 %
and corrupts 0.5 % of the frames both ways, where the endpoint must retransmit
and every byte must still arrive. Both include the close and reopen of one host
QP (``--repeat 2``). The third runs the example event source (``--example``, the
EventCore of tests/sim/test_event_source.py, one build for both): host.read_events
in the guest reads its fragments through the receive API from the ring its OPEN_QP
announced. The checks of :func:`sim.softroce.demo.check_run` are tested
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
    DemoResult,
    DemoRun,
    RunCheck,
    check_run,
    example_netdev_options,
    expected_sha256,
    guest_script,
    run_demo,
    simulation_figures,
)
from sim.softroce.image import cached_image
from sim.softroce.tools import HostToolsError, ensure_host_tools
from sim.softroce.vm import QEMU

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
        return {"ok": True, "pass": number, "messages": run.count * run.qps, "qp": qps,
                "gbytes_per_s": 0.0}
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
    assert "--write --imm --size 256 --count 3 --repeat 2 --json" in script
    assert "--send --size 3000 --count 2 --mtu 1024 --json" in script


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


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _demo(runs: tuple[DemoRun, ...], name: str, faults: tuple[str, ...] = (),
          netdev_options: tuple[str, ...] = (), build: Callable[[], object] | None = None
          ) -> DemoResult:
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
                      netdev_options=netdev_options)
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
                 build=lambda: event_core_design(run.size))    # test_event_source.py's


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
