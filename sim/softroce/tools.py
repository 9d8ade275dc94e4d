"""The host tools the Soft-RoCE guest needs: QEMU, mmdebstrap and mkfs.ext4.

:func:`ensure_host_tools` finds them and, when some are missing and this process
is root on a machine with ``apt-get``, installs their Debian packages quietly.
Otherwise it raises :class:`HostToolsError` saying what to install and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PACKAGES", "HostTools", "HostToolsError", "ensure_host_tools", "find_tool",
           "install_hint"]

#: Each tool, the Debian package that has it, and what the harness uses it for.
PACKAGES: dict[str, tuple[str, str]] = {
    "qemu-system-x86_64": ("qemu-system-x86", "boots the guest (TCG software emulation)"),
    "mmdebstrap": ("mmdebstrap", "builds the guest's Debian root file system"),
    "mkfs.ext4": ("e2fsprogs", "turns that root file system into an ext4 disk image"),
}

# Where Debian keeps administrator tools, which a non-root PATH often lacks.
_SBIN = (Path("/usr/sbin"), Path("/sbin"))
_APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "APT_LISTCHANGES_FRONTEND": "none"}


class HostToolsError(RuntimeError):
    """A host tool is missing and could not be installed; the message says what to do."""


@dataclass(frozen=True)
class HostTools:
    """Absolute paths of the host tools."""
    qemu: Path
    mmdebstrap: Path
    mkfs_ext4: Path


def find_tool(name: str) -> Path | None:
    """``name`` on ``PATH`` or in ``/usr/sbin``/``/sbin``, or None."""
    found = shutil.which(name)
    if found is None:
        found = shutil.which(name, path=os.pathsep.join(str(path) for path in _SBIN))
    return Path(found) if found else None


def install_hint(missing: list[str]) -> str:
    """What to install for the tools in ``missing`` and why, as one sentence."""
    packages = " ".join(dict.fromkeys(PACKAGES[name][0] for name in missing))
    reasons = "; ".join(f"{name} {PACKAGES[name][1]}" for name in missing)
    return (f"missing {', '.join(missing)} ({reasons}): as root run "
            f"`apt-get install --no-install-recommends {packages}`")


def _can_install() -> bool:
    return os.geteuid() == 0 and find_tool("apt-get") is not None


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "-qq", "-y", *args], env={**os.environ, **_APT_ENV},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)


def _install(missing: list[str]) -> None:
    packages = list(dict.fromkeys(PACKAGES[name][0] for name in missing))
    result = _apt("install", "--no-install-recommends", *packages)
    if result.returncode != 0:
        # A machine whose package lists were never fetched cannot find the packages.
        _apt("update")
        result = _apt("install", "--no-install-recommends", *packages)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise HostToolsError(f"`apt-get install {' '.join(packages)}` failed "
                             f"(exit {result.returncode}):\n{tail}")


def _missing(needed: tuple[str, ...]) -> list[str]:
    return [name for name in needed if find_tool(name) is None]


def ensure_host_tools(*, install: bool = True,
                      needed: tuple[str, ...] = tuple(PACKAGES)) -> HostTools:
    """Find QEMU, mmdebstrap and mkfs.ext4, installing the missing ones if possible.

    ``needed`` limits the tools that must be there (booting a cached image needs
    only ``qemu-system-x86_64``); the paths of the others may then be bare names.

    Installs (``apt-get install --no-install-recommends``, noninteractive, output
    shown only on failure) when ``install`` is true, this process is root and
    ``apt-get`` exists. Raises :class:`HostToolsError` naming the packages and
    why they are needed when the tools are missing and cannot be installed.
    """
    unknown = set(needed) - set(PACKAGES)
    if unknown:
        raise ValueError(f"needed names tools the harness does not know: {sorted(unknown)}")
    missing = _missing(needed)
    if missing and install and _can_install():
        _install(missing)
        missing = _missing(needed)
    if missing:
        why = ("" if _can_install() or not install else
               "not root" if find_tool("apt-get") is not None else "no apt-get on this machine")
        raise HostToolsError(install_hint(missing) + (f" ({why}, so not installed here)"
                                                      if why else ""))
    paths = {name: find_tool(name) or Path(name) for name in PACKAGES}
    return HostTools(qemu=paths["qemu-system-x86_64"], mmdebstrap=paths["mmdebstrap"],
                     mkfs_ext4=paths["mkfs.ext4"])
