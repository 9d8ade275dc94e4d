"""The Soft-RoCE guest's disk image: a Debian bookworm with rdma_rxe, built once and cached.

The recipe (:class:`Recipe`) is data: suite, mirrors, packages, the init script
(``init.sh`` beside this file), the kernel modules dropped, the initramfs
modules. :func:`build_image` runs ``mmdebstrap --variant=essential`` as root
into a temporary folder, trims it, copies the kernel and initramfs out of
``/boot`` and packs the rest with ``mkfs.ext4 -d``. The result lives in
``build/softroce/<digest>/`` (``rootfs.ext4``, ``vmlinuz``, ``initrd.img``,
``build.json``, ``build.log``), where the digest covers every input of the
build; a changed recipe gets a new folder, an unchanged one is reused.

A build is atomic: it happens in ``build/softroce/.tmp-*`` under a lock file and
is renamed into place only when complete; a failed or interrupted build leaves
only ``build/softroce/failed-<digest>.log``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from .tools import ensure_host_tools

__all__ = ["ROOT", "CACHE", "PACKAGES", "Recipe", "DEFAULT_RECIPE", "Image", "ImageError",
           "build_image", "cached_image"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "softroce"

#: Guest packages: the kernel, rdma-core with its tools and pyverbs, numpy (the host's
#: checker and receive API), and what the init uses.
PACKAGES = (
    "linux-image-amd64", "initramfs-tools", "kmod", "mount", "iproute2", "iputils-ping",
    "rdma-core", "ibverbs-utils", "ibverbs-providers", "rdmacm-utils", "perftest",
    "python3", "python3-pyverbs", "python3-numpy", "procps", "ethtool",
)

#: Kernel module folders (under ``/lib/modules/<release>/kernel``) a virtio guest never loads.
DROPPED_MODULES = (
    "drivers/gpu", "drivers/media", "drivers/net/wireless", "drivers/net/ethernet",
    "drivers/net/can", "drivers/net/usb", "drivers/net/wwan", "drivers/infiniband/hw",
    "drivers/bluetooth", "drivers/staging", "drivers/iio", "drivers/isdn", "drivers/usb",
    "drivers/scsi", "drivers/ata", "drivers/hwmon", "drivers/mtd", "drivers/thunderbolt",
    "sound", "net/wireless", "net/mac80211", "net/bluetooth",
    "fs/btrfs", "fs/xfs", "fs/ocfs2", "fs/gfs2", "fs/nfs", "fs/nfsd", "fs/ceph", "fs/smb",
    "fs/f2fs", "fs/jfs", "fs/reiserfs", "fs/nilfs2", "fs/ntfs3", "fs/ubifs",
)

#: Modules the initramfs needs to mount ``/dev/vda`` (``MODULES=list``: nothing else).
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4")

_INIT = Path(__file__).with_name("init.sh")
_IN_GUEST_INIT = "/sbin/softroce-init"
# Bump when a build step outside the mmdebstrap command changes (kernel copy, mkfs).
_STEPS_VERSION = 1


class ImageError(RuntimeError):
    """The image could not be built; the message says why and where the log is."""


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the guest image; its :meth:`digest` names the cache folder."""
    suite: str = "bookworm"
    mirrors: tuple[str, ...] = (
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    )
    packages: tuple[str, ...] = PACKAGES
    dropped_modules: tuple[str, ...] = DROPPED_MODULES
    initramfs_modules: tuple[str, ...] = INITRAMFS_MODULES
    init: str = field(default_factory=lambda: _INIT.read_text())

    def mmdebstrap_command(self, mmdebstrap: Path | str, rootfs: Path | str,
                           init: Path | str) -> list[str]:
        """The ``mmdebstrap`` command that builds the root file system into ``rootfs``.

        ``init`` is a host file with :attr:`init`, installed as the guest's init.
        """
        initramfs_conf = "MODULES=list\nCOMPRESS=gzip\n"
        modules = "".join(f"{name}\n" for name in self.initramfs_modules)
        drop = " ".join(shlex.quote(path) for path in self.dropped_modules)
        setup = (f'mkdir -p "$1/etc/initramfs-tools/conf.d" && printf %s '
                 f'{shlex.quote(initramfs_conf)} > "$1/etc/initramfs-tools/conf.d/softroce"')
        customize = [
            f'install -m 755 {shlex.quote(str(init))} "$1{_IN_GUEST_INIT}"',
            f'for release in "$1"/lib/modules/*; do for path in {drop}; do '
            f'rm -rf "$release/kernel/$path"; done; '
            f'chroot "$1" depmod -a "${{release##*/}}"; done',
            f'printf %s {shlex.quote(modules)} >> "$1/etc/initramfs-tools/modules"',
            'chroot "$1" update-initramfs -u -k all',
            'echo softroce > "$1/etc/hostname"',
            'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*.log',
        ]
        excluded = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                    "/usr/share/locale/*", "/usr/share/lintian/*")
        return [
            str(mmdebstrap), "--mode=root", "--variant=essential", "--format=directory",
            f"--include={','.join(self.packages)}",
            '--aptopt=APT::Install-Recommends "false"',
            '--aptopt=Acquire::Retries "3"',
            # apt drops to its _apt user to download and to call gpgv; where /dev/null
            # is not writable by other users (seen in CI sandboxes: mode 0755), that
            # user's `command -v gpgv >/dev/null` fails and every Release file reads as
            # unsigned. The build is root already, so apt stays root.
            '--aptopt=APT::Sandbox::User "root"',
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in excluded),
            f"--setup-hook={setup}",
            *(f"--customize-hook={hook}" for hook in customize),
            self.suite, str(rootfs), *self.mirrors,
        ]

    def digest(self) -> str:
        """16 hex digits of SHA-256 over every build input."""
        inputs = {"recipe": asdict(self), "steps": _STEPS_VERSION,
                  "command": self.mmdebstrap_command("mmdebstrap", "ROOTFS", "INIT")}
        text = json.dumps(inputs, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


DEFAULT_RECIPE = Recipe()


@dataclass(frozen=True)
class Image:
    """A built guest: ext4 root file system, kernel, initramfs and the build's record."""
    directory: Path

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs.ext4"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def init(self) -> str:
        """The guest's init, for the kernel command line."""
        return _IN_GUEST_INIT

    @property
    def info(self) -> dict:
        """``build.json``: digest, kernel release, build seconds, sizes, date."""
        return json.loads((self.directory / "build.json").read_text())

    def complete(self) -> bool:
        return all(path.is_file() for path in (self.rootfs, self.kernel, self.initrd,
                                               self.directory / "build.json"))


def cached_image(recipe: Recipe = DEFAULT_RECIPE, cache: Path = CACHE) -> Image | None:
    """The built image of ``recipe`` in ``cache``, or None if there is none yet."""
    image = Image(cache / recipe.digest())
    return image if image.complete() else None


def build_image(recipe: Recipe = DEFAULT_RECIPE, *, cache: Path = CACHE, rebuild: bool = False,
                log: Callable[[str], None] | None = None) -> Image:
    """The image of ``recipe``: the cached one, or a new build (1–2.5 minutes, root).

    ``rebuild`` replaces a cached image. ``log`` receives progress lines
    (mmdebstrap's ``I:`` lines and the build's steps). Raises
    :class:`ImageError` when not root or when a build step fails; the full
    output is then in ``cache/failed-<digest>.log``.
    """
    say = log or (lambda line: None)
    image = cached_image(recipe, cache)
    if image is not None and not rebuild:
        return image
    if os.geteuid() != 0:
        raise ImageError(
            "building the Soft-RoCE guest image needs root (mmdebstrap chroots, and the "
            "ext4 image must keep root ownership): run `python -m sim.softroce.guest build` "
            f"once as root; booting it later does not need root. Cache: {cache}")
    tools = ensure_host_tools()
    _make_cache(cache)
    digest = recipe.digest()
    final = cache / digest
    with _locked(cache / ".lock"):
        if final.exists() and Image(final).complete() and not rebuild:
            return Image(final)  # another process built it while we waited
        for stale in cache.glob(".tmp-*"):
            _remove_tree(stale)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{digest}-", dir=cache))
        work.chmod(0o755)  # apt's _apt user downloads into it; others boot the result
        failed_log = cache / f"failed-{digest}.log"
        try:
            _build(recipe, tools.mmdebstrap, tools.mkfs_ext4, work, say)
            if final.exists():  # --rebuild: retire the old image out of the way first
                final.rename(Path(tempfile.mkdtemp(prefix=f".tmp-{digest}-old-", dir=cache))
                             / "image")
            work.rename(final)
        except BaseException as error:
            kept = (work / "build.log").exists()
            if kept:
                shutil.copyfile(work / "build.log", failed_log)
            _remove_tree(work)
            if isinstance(error, Exception) and kept:
                raise ImageError(f"{error}\nfull log: {failed_log}") from error
            raise
        failed_log.unlink(missing_ok=True)
        for retired in cache.glob(".tmp-*"):
            _remove_tree(retired)
        _prune(cache, keep=final)
    return Image(final)


def _build(recipe: Recipe, mmdebstrap: Path, mkfs: Path, work: Path,
           say: Callable[[str], None]) -> None:
    started = time.monotonic()
    rootfs = work / "rootfs"
    init = work / "init.sh"
    init.write_text(recipe.init)
    build_log = work / "build.log"
    with build_log.open("w") as log_file:
        say(f"mmdebstrap {recipe.suite} with {len(recipe.packages)} packages into {rootfs}")
        _run(recipe.mmdebstrap_command(mmdebstrap, rootfs, init), log_file, say,
             echo=lambda line: line.startswith(("I:", "E:", "W:")))
        bootstrap_seconds = time.monotonic() - started
        release = _kernel_release(rootfs)
        for name, source in (("vmlinuz", f"vmlinuz-{release}"),
                             ("initrd.img", f"initrd.img-{release}")):
            shutil.move(rootfs / "boot" / source, work / name)
            (work / name).chmod(0o644)
        files, used = _tree_size(rootfs)
        size_mib = (used * 5 // 4) // (1 << 20) + 128
        say(f"mkfs.ext4 -d: {used / 1e6:.0f} MB in {files} files, image {size_mib} MiB")
        _run([str(mkfs), "-q", "-F", "-L", "softroce", "-O", "^has_journal", "-m", "0",
              "-N", str(files + files // 2 + 4096), "-d", str(rootfs),
              str(work / "rootfs.ext4"), f"{size_mib}M"], log_file, say, echo=lambda line: True)
        _remove_tree(rootfs)
        init.unlink()
    info = {
        "digest": recipe.digest(), "suite": recipe.suite, "kernel_release": release,
        "packages": list(recipe.packages),
        "build_seconds": round(time.monotonic() - started, 1),
        "bootstrap_seconds": round(bootstrap_seconds, 1),
        "rootfs_bytes": (work / "rootfs.ext4").stat().st_size,
        "rootfs_used_bytes": (work / "rootfs.ext4").stat().st_blocks * 512,
        "kernel_bytes": (work / "vmlinuz").stat().st_size,
        "initrd_bytes": (work / "initrd.img").stat().st_size,
        "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (work / "build.json").write_text(json.dumps(info, indent=2) + "\n")


def _run(command: list[str], log_file: TextIO, say: Callable[[str], None],
         echo: Callable[[str], bool]) -> None:
    log_file.write(f"$ {shlex.join(command)}\n")
    log_file.flush()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    try:
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            log_file.write(line)
            line = line.rstrip("\n")
            tail = [*tail[-19:], line]
            if echo(line):
                say(line if len(line) <= 120 else line[:117] + "...")
        code = process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if code != 0:
        text = "\n".join(tail)
        raise ImageError(f"{Path(command[0]).name} failed (exit {code}); last lines:\n{text}")


def _kernel_release(rootfs: Path) -> str:
    releases = sorted(path.name for path in (rootfs / "lib" / "modules").iterdir())
    if len(releases) != 1:
        raise ImageError(f"expected one kernel in the guest, found {releases or 'none'}")
    return releases[0]


def _tree_size(root: Path) -> tuple[int, int]:
    files = used = 0
    for directory, subdirectories, names in os.walk(root):
        for name in (*subdirectories, *names):
            files += 1
            used += os.lstat(os.path.join(directory, name)).st_size
    return files, used


def _make_cache(cache: Path) -> None:
    """Create ``cache``, owned like the repository: a ``sudo`` build leaves it writable for
    the user who boots the guest (console logs go there); the images stay root's."""
    missing = [path for path in (cache, *cache.parents) if not path.exists()]
    cache.mkdir(parents=True, exist_ok=True)
    owner = ROOT.stat()
    for path in (*missing, cache):
        if path.stat().st_uid != owner.st_uid:
            os.chown(path, owner.st_uid, owner.st_gid)


def _prune(cache: Path, keep: Path, others: int = 1) -> None:
    """Remove older images, keeping ``keep`` and the ``others`` most recent besides it
    (switching between two branches should not rebuild every time)."""
    images = sorted((path for path in cache.iterdir() if path.is_dir() and path != keep
                     and not path.name.startswith(".") and (path / "build.json").exists()),
                    key=lambda path: path.stat().st_mtime, reverse=True)
    for path in images[others:]:
        _remove_tree(path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    mounts = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                mounts.append(point)
    return mounts


def _remove_tree(path: Path) -> None:
    """``rm -rf path``, after unmounting whatever a killed chroot left mounted inside."""
    if not path.exists():
        return
    for point in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
    if _mounts_under(path):
        raise ImageError(f"cannot remove {path}: file systems are still mounted inside it")
    shutil.rmtree(path)
