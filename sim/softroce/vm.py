"""Boots the Soft-RoCE guest in QEMU (TCG) and runs one shell script in it.

The guest's init (``init.sh``) mounts the repository (read-only, virtio-9p) at
``/mnt/repo``, sets up eth0 (MTU, IPv4 address, an optional static neighbour)
and ``rxe0`` on it, runs the script with the repository as working directory
and ``PYTHONPATH``, and powers off. The script sees ``SOFTROCE_IP``,
``SOFTROCE_MTU``, ``SOFTROCE_NEIGHBOUR_IP`` and ``SOFTROCE_NEIGHBOUR_MAC``.

With a second NIC (:class:`SecondNic`, for the two ports of the two-cage board)
the guest also has eth1 on a netdev of its own, in a subnet of its own: the
script's first lines set it up like eth0 (MTU, address, static neighbour) and
add ``rxe1`` on it, before the script proper runs. Its connected route sends
the traffic to its subnet out of eth1, and rxe1's IPv4 GID (index 1) is
eth1's address. The script also sees ``SOFTROCE_IP1``.

eth0 is a virtio-net NIC on ``-netdev dgram``: every Ethernet frame (no FCS) is
one UDP datagram between ``127.0.0.1:local_port`` (QEMU) and
``127.0.0.1:remote_port`` (whoever plays the network: a simulation bridge, a
Scapy peer). No host privileges are needed to boot.

The serial console goes to a log file line by line as it arrives; the init's
markers on it give the timing and the script's exit code (see ``init.sh``).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .image import CACHE, ROOT, Image, build_image
from .tools import ensure_host_tools

__all__ = ["GuestConfig", "SecondNic", "GuestResult", "GuestError", "GuestTimeout", "Guest",
           "run_script", "DEFAULT_LOCAL_PORT", "DEFAULT_REMOTE_PORT", "DEFAULT_MAC",
           "DEFAULT_IP", "DEFAULT_LOCAL_PORT2", "DEFAULT_REMOTE_PORT2", "DEFAULT_MAC2",
           "DEFAULT_IP2", "ETH1_SETUP_FAILED"]

#: QEMU's end of the dgram netdev.
DEFAULT_LOCAL_PORT = 17300
#: The network's end: a simulation bridge or peer binds 127.0.0.1 to this port.
DEFAULT_REMOTE_PORT = 17301
#: The guest's eth0 (QEMU's usual first MAC; the project's benches use it for the rxe peer).
DEFAULT_MAC = "52:54:00:12:34:56"
DEFAULT_IP = "10.77.0.1/24"
#: eth1's netdev (a second NIC): QEMU's end and the network's.
DEFAULT_LOCAL_PORT2 = 17302
DEFAULT_REMOTE_PORT2 = 17303
#: eth1: QEMU's usual second MAC, and an address in the subnet of the two-cage board's
#: second port (:data:`boards.vcu118_top.PORT2_ADDRESS`, 10.77.1.2).
DEFAULT_MAC2 = "52:54:00:12:34:57"
DEFAULT_IP2 = "10.77.1.1/24"
#: The script's exit code when setting up eth1 and rxe1 failed.
ETH1_SETUP_FAILED = 125

#: One console line as it arrives, and whether it is the script's output.
LineCallback = Callable[[str, bool], None]

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_EXIT = re.compile(r"^=== exit (\d+) ===$")
_MARKER = re.compile(r"^=== softroce: (\w+):? ?(.*) ===$")
_KERNEL_ARGS = ("root=/dev/vda", "rw", "rootfstype=ext4", "console=ttyS0", "net.ifnames=0",
                "quiet", "panic=-1")
_PR_SET_PDEATHSIG = 1
QEMU = "qemu-system-x86_64"
_TAIL_LINES = 30
_WORKDIR_PREFIX = "softroce-run-"


class GuestError(RuntimeError):
    """The guest did not run the script to its end; the message has the console's tail."""


class GuestTimeout(GuestError):
    """The overall timeout passed; QEMU was killed."""


def _check_port(name: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"{name} must be a UDP port 1..65535, not {port!r}")


def _check_nic(local_port: int, remote_port: int, mac: str, ip: str,
               neighbour: tuple[str, str] | None, example_ip: str) -> None:
    """The checks one NIC's settings share: ports, MAC, address with prefix, neighbour."""
    _check_port("local_port", local_port)
    _check_port("remote_port", remote_port)
    if local_port == remote_port:
        raise ValueError(f"local_port and remote_port are both {local_port}")
    if not isinstance(mac, str) or not _MAC.match(mac.lower()):
        raise ValueError(f"mac must look like 52:54:00:12:34:56, not {mac!r}")
    try:
        ipaddress.IPv4Interface(ip)
    except ValueError:
        raise ValueError(f"ip must be an IPv4 address with prefix, such as "
                         f"{example_ip}, not {ip!r}") from None
    if "/" not in ip:
        raise ValueError(f"ip needs a prefix length ({example_ip}), not {ip!r}")
    if neighbour is not None:
        neighbour_ip, neighbour_mac = neighbour
        ipaddress.IPv4Address(neighbour_ip)
        if not _MAC.match(neighbour_mac.lower()):
            raise ValueError(f"neighbour MAC must look like 02:00:00:00:00:02, "
                             f"not {neighbour_mac!r}")


@dataclass(frozen=True)
class SecondNic:
    """The guest's eth1 with ``rxe1``: its own netdev ports, MAC, address with prefix (a
    subnet other than eth0's) and optional static neighbour ``(ip, mac)``; its MTU is
    eth0's."""
    local_port: int = DEFAULT_LOCAL_PORT2
    remote_port: int = DEFAULT_REMOTE_PORT2
    mac: str = DEFAULT_MAC2
    ip: str = DEFAULT_IP2
    neighbour: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        _check_nic(self.local_port, self.remote_port, self.mac, self.ip, self.neighbour,
                   DEFAULT_IP2)

    def setup_script(self) -> str:
        """The shell lines that set up eth1 and rxe1 (run first in the guest's script);
        the script exits :data:`ETH1_SETUP_FAILED` if one fails."""
        steps = ['ip link set eth1 mtu "$SOFTROCE_MTU" up',
                 f"ip addr add {shlex.quote(self.ip)} dev eth1"]
        if self.neighbour is not None:
            neighbour_ip, neighbour_mac = self.neighbour
            steps.append(f"ip neigh replace {shlex.quote(neighbour_ip)} lladdr "
                         f"{shlex.quote(neighbour_mac.lower())} dev eth1 nud permanent")
        steps.append("rdma link add rxe1 type rxe netdev eth1")
        return "".join(f"{step} || {{ echo 'softroce: eth1 setup failed: {step}' >&2; "
                       f"exit {ETH1_SETUP_FAILED}; }}\n" for step in steps)


@dataclass(frozen=True)
class GuestConfig:
    """How to boot the guest and set up its network.

    ``ip`` is the guest's address with prefix length; ``neighbour`` an optional
    ``(ip, mac)`` static ARP entry (the endpoint's: moving a QP to RTR then
    skips ARP, 7 ms instead of about 1 s). ``timeout`` (seconds) covers boot,
    script and power-off.
    """
    local_port: int = DEFAULT_LOCAL_PORT
    remote_port: int = DEFAULT_REMOTE_PORT
    mac: str = DEFAULT_MAC
    ip: str = DEFAULT_IP
    mtu: int = 9000
    neighbour: tuple[str, str] | None = None
    memory_mib: int = 1024
    cpus: int = 1
    timeout: float = 300.0
    extra_kernel_args: tuple[str, ...] = field(default=())
    eth1: SecondNic | None = None

    def __post_init__(self) -> None:
        _check_nic(self.local_port, self.remote_port, self.mac, self.ip, self.neighbour,
                   DEFAULT_IP)
        if not 68 <= self.mtu <= 65535:
            raise ValueError(f"mtu must be 68..65535, not {self.mtu!r}")
        if self.eth1 is not None:
            ports = {self.local_port, self.remote_port}
            if ports & {self.eth1.local_port, self.eth1.remote_port}:
                raise ValueError(f"eth1's ports {self.eth1.local_port}, "
                                 f"{self.eth1.remote_port} overlap eth0's {sorted(ports)}")
            if self.eth1.mac.lower() == self.mac.lower():
                raise ValueError(f"eth1 and eth0 both have MAC {self.mac}")
            subnets = [ipaddress.IPv4Interface(ip).network for ip in (self.ip, self.eth1.ip)]
            if subnets[0].overlaps(subnets[1]):
                raise ValueError(f"eth1 ({self.eth1.ip}) needs a subnet of its own, apart "
                                 f"from eth0's ({self.ip}), so that its route sends its "
                                 "traffic out of eth1")
        if self.memory_mib < 256:
            raise ValueError(f"memory_mib must be at least 256, not {self.memory_mib!r}")
        if not 1 <= self.cpus <= 8:
            raise ValueError(f"cpus must be 1..8, not {self.cpus!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {self.timeout!r}")

    def environment(self) -> dict[str, str]:
        """The ``SOFTROCE_*`` variables the init reads and the script sees."""
        neighbour_ip, neighbour_mac = self.neighbour or ("", "")
        return {"SOFTROCE_IP": self.ip, "SOFTROCE_MTU": str(self.mtu),
                "SOFTROCE_NEIGHBOUR_IP": neighbour_ip, "SOFTROCE_NEIGHBOUR_MAC": neighbour_mac,
                **({"SOFTROCE_IP1": self.eth1.ip} if self.eth1 is not None else {})}

    def script(self, script: str) -> str:
        """The script the guest runs for ``script``: with eth1, its setup comes first."""
        if self.eth1 is None:
            return script
        return "#!/bin/sh\n" + self.eth1.setup_script() + script


@dataclass(frozen=True)
class GuestResult:
    """What the script did: its exit code and output, and how long each phase took."""
    exit_code: int
    output: str
    log_path: Path
    boot_seconds: float
    script_seconds: float
    total_seconds: float

    def timing_text(self) -> str:
        return (f"boot {self.boot_seconds:.1f} s, script {self.script_seconds:.1f} s, "
                f"total {self.total_seconds:.1f} s (QEMU start to exit)")


class Guest:
    """One QEMU run of the guest with ``script`` (shell text); a context manager.

    ``with Guest(script, config) as guest:`` starts QEMU; :meth:`wait_ready`
    returns once eth0 and rxe0 are up (10–20 s under TCG here), :meth:`wait` once
    the script has finished and QEMU has exited. Leaving the block (also by an
    exception) kills QEMU if it still runs and removes the run's temporary
    folder. QEMU also dies with the thread that started it (``PR_SET_PDEATHSIG``).

    ``image`` defaults to the cached default image (built if missing, which needs
    root). The console goes to ``log_path`` (default
    ``build/softroce/console-<local_port>.log``); ``on_line`` gets every console
    line as it arrives, with a flag telling whether it is the script's output.
    """

    def __init__(self, script: str, config: GuestConfig | None = None, *,
                 image: Image | None = None, log_path: Path | None = None,
                 on_line: LineCallback | None = None) -> None:
        if not isinstance(script, str):
            raise TypeError(f"script must be shell text (str), not {type(script).__name__}")
        self._script = script
        self._config = config or GuestConfig()
        self._image = image
        self._log_path = log_path or CACHE / f"console-{self._config.local_port}.log"
        self._on_line = on_line
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._changed = threading.Condition()
        self._tail: list[str] = []
        self._output: list[str] = []
        self._in_script = False
        self._started = 0.0
        self._ready_at: float | None = None
        self._script_at: float | None = None
        self._exit_at: float | None = None
        self._exit_code: int | None = None
        self._failure: str | None = None
        self._eof = False

    @property
    def config(self) -> GuestConfig:
        return self._config

    @property
    def log_path(self) -> Path:
        return self._log_path

    def command(self, image: Image, job: Path) -> list[str]:
        """The QEMU command line for ``image`` with ``job`` as the job share."""
        config = self._config
        nics = [(config.local_port, config.remote_port, config.mac)]
        if config.eth1 is not None:
            nics.append((config.eth1.local_port, config.eth1.remote_port, config.eth1.mac))
        network = []
        for number, (local_port, remote_port, mac) in enumerate(nics):
            network += [
                "-netdev", (f"dgram,id=n{number},local.type=inet,local.host=127.0.0.1,"
                            f"local.port={local_port},remote.type=inet,"
                            f"remote.host=127.0.0.1,remote.port={remote_port}"),
                # romfile= : no iPXE option ROM, the kernel is loaded directly.
                "-device", f"virtio-net-pci,netdev=n{number},mac={mac.lower()},romfile="]
        kernel_args = " ".join((*_KERNEL_ARGS, f"init={image.init}", *config.extra_kernel_args))
        return [
            str(ensure_host_tools(needed=(QEMU,)).qemu), "-nodefaults", "-no-user-config",
            "-no-reboot",
            "-accel", "tcg", "-machine", "pc", "-m", str(config.memory_mib),
            "-smp", str(config.cpus), "-display", "none", "-serial", "stdio",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", kernel_args,
            "-drive", f"file={image.rootfs},if=virtio,format=raw,snapshot=on",
            *network,
            "-virtfs", f"local,path={ROOT},mount_tag=repo,security_model=none,readonly=on",
            "-virtfs", f"local,path={job},mount_tag=job,security_model=none",
        ]

    def start(self) -> None:
        """Write the job share and start QEMU; returns at once."""
        if self._process is not None:
            raise GuestError("this Guest was already started")
        image = self._image or build_image()
        _check_port_free(self._config.local_port)
        if self._config.eth1 is not None:
            _check_port_free(self._config.eth1.local_port)
        _remove_stale_workdirs()
        self._workdir = tempfile.TemporaryDirectory(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
        try:
            job = Path(self._workdir.name) / "job"
            scratch = Path(self._workdir.name) / "tmp"  # QEMU's snapshot=on overlay
            job.mkdir()
            scratch.mkdir()
            (job / "config").write_text("".join(
                f"export {name}={shlex.quote(value)}\n"
                for name, value in self._config.environment().items()))
            (job / "script").write_text(self._config.script(self._script))
            (job / "script").chmod(0o755)
            command = self.command(image, job)
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self._log_path.open("w", encoding="utf-8")
        except BaseException:
            self.close()
            raise
        self._started = time.monotonic()
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(scratch)},
                preexec_fn=_die_with(os.getpid()), start_new_session=True)
        except BaseException:
            log.close()
            self.close()
            raise
        self._reader = threading.Thread(target=self._read, args=(log,), daemon=True,
                                        name="softroce-console")
        self._reader.start()

    def wait_ready(self) -> float:
        """Wait until eth0 and rxe0 are up; returns seconds since QEMU started."""
        self._wait_for(lambda: self._ready_at is not None)
        assert self._ready_at is not None
        return self._ready_at - self._started

    def wait(self) -> GuestResult:
        """Wait for the script's exit and QEMU's; the result has the script's exit code."""
        self._wait_for(lambda: self._eof)
        assert self._process is not None
        try:
            self._process.wait(max(1.0, self._remaining()))
        except subprocess.TimeoutExpired:
            self._timeout()
        ended = time.monotonic()
        if self._exit_code is None or self._ready_at is None or self._script_at is None:
            what = (f"setup step failed: {self._failure}" if self._failure else
                    f"QEMU exited (code {self._process.returncode}) before the script ended")
            raise GuestError(f"{what}; console log {self._log_path}, last lines:\n"
                             + self._tail_text())
        exit_at = self._exit_at or ended
        return GuestResult(
            exit_code=self._exit_code, output="".join(f"{line}\n" for line in self._output),
            log_path=self._log_path, boot_seconds=self._ready_at - self._started,
            script_seconds=exit_at - self._script_at, total_seconds=ended - self._started)

    def close(self) -> None:
        """Kill QEMU if it still runs; remove the run's temporary folder."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if self._reader is not None:
            self._reader.join(10)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Guest:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _remaining(self) -> float:
        return self._config.timeout - (time.monotonic() - self._started)

    def _wait_for(self, condition: Callable[[], bool]) -> None:
        if self._process is None:
            raise GuestError("the Guest is not started")
        with self._changed:
            while not condition():
                if self._eof:
                    break
                remaining = self._remaining()
                if remaining <= 0:
                    self._timeout()
                self._changed.wait(min(remaining, 1.0))
        if not condition():
            self.wait()  # raises with the reason the guest ended early

    def _phase(self) -> str:
        if self._eof:
            return "the console closed but QEMU did not exit"
        if self._exit_code is not None:
            return "the script ended but the guest did not power off"
        if self._script_at is not None:
            return "the script was still running"
        return "the guest was not ready yet (booting or setting up eth0 and rxe0)"

    def _timeout(self) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait()
        raise GuestTimeout(f"QEMU killed after {time.monotonic() - self._started:.0f} s "
                           f"(timeout {self._config.timeout:g} s): {self._phase()}; console log "
                           f"{self._log_path}, last lines:\n{self._tail_text()}")

    def _tail_text(self) -> str:
        with self._changed:
            return "\n".join(self._tail)

    def _read(self, log: TextIO) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            with log:
                for raw in self._process.stdout:
                    line = raw.decode("utf-8", "replace").rstrip("\r\n").replace("\r", "")
                    log.write(line + "\n")
                    log.flush()
                    self._take(line)
        finally:
            with self._changed:
                self._eof = True
                self._changed.notify_all()

    def _take(self, line: str) -> None:
        now = time.monotonic()
        exit_match = _EXIT.match(line)
        marker = _MARKER.match(line)
        with self._changed:
            self._tail = [*self._tail[-(_TAIL_LINES - 1):], line]
            script_line = self._in_script and exit_match is None
            if exit_match:
                self._exit_code = int(exit_match.group(1))
                self._exit_at = now
                self._in_script = False
            elif script_line:
                self._output.append(line)
            elif marker:
                name, value = marker.groups()
                if name == "ready":
                    self._ready_at = now
                elif name == "script":
                    self._script_at = now
                    self._in_script = True
                elif name == "failed":
                    self._failure = value
            self._changed.notify_all()
        if self._on_line is not None:
            self._on_line(line, script_line)


def run_script(script: str, config: GuestConfig | None = None, *, image: Image | None = None,
               log_path: Path | None = None, on_line: LineCallback | None = None) -> GuestResult:
    """Boot the guest, run ``script`` in it, power off; see :class:`Guest`."""
    with Guest(script, config, image=image, log_path=log_path, on_line=on_line) as guest:
        return guest.wait()


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise GuestError(f"UDP 127.0.0.1:{port} (QEMU's end of the netdev) is taken: "
                             f"{error.strerror}; pick another local port") from None


def _remove_stale_workdirs() -> None:
    """Remove run folders whose process died without cleaning up (SIGKILL)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_WORKDIR_PREFIX).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it ends."""
    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)
    return arm
