"""A real RoCEv2 peer on one machine: Linux Soft-RoCE (rdma_rxe) in a QEMU guest.

* :mod:`.tools`: the host tools (QEMU, mmdebstrap, mkfs.ext4), installed on demand;
* :mod:`.image`: the guest recipe and its cached ext4 image, kernel and initramfs;
* :mod:`.vm`: boots the guest under TCG with eth0 on ``-netdev dgram`` (one UDP
  datagram per Ethernet frame on 127.0.0.1) and runs a shell script in it;
* :mod:`.guest`: the command line, ``python -m sim.softroce.guest build|run``;
* :mod:`.demo`: ``make sim``, qp-server in the guest against the simulated
  endpoint (``python -m sim.netdev``), every byte and every STATUS checked.

``init.sh`` is the guest's init (part of the recipe: editing it rebuilds the image).
"""

from .image import DEFAULT_RECIPE, Image, ImageError, Recipe, build_image, cached_image
from .tools import HostTools, HostToolsError, ensure_host_tools
from .vm import Guest, GuestConfig, GuestError, GuestResult, GuestTimeout, run_script

__all__ = ["DEFAULT_RECIPE", "Guest", "GuestConfig", "GuestError", "GuestResult",
           "GuestTimeout", "HostTools", "HostToolsError", "Image", "ImageError", "Recipe",
           "build_image", "cached_image", "ensure_host_tools", "run_script"]
