"""``--numa-node``: run on one NUMA node's CPUs so buffers are allocated there too.

:func:`pin_to_node` restricts the whole process to the node's CPUs (Linux
``sched_setaffinity``). Memory follows by first touch: the verbs buffers are
allocated and zeroed after pinning, so under the default (local) memory policy
their pages come from that node. Nothing here needs libnuma.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import HostError

__all__ = ["NODE_ROOT", "parse_cpulist", "node_cpus", "pin_to_node"]

NODE_ROOT = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> set[int]:
    """The CPUs of a kernel cpulist such as ``0-3,8,10-11`` (also ``0-7:2`` strides)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        span, _, stride = part.partition(":")
        first, _, last = span.partition("-")
        try:
            low = int(first)
            high = int(last) if last else low
            step = int(stride) if stride else 1
        except ValueError:
            raise ValueError(f"not a CPU list: {text.strip()!r}") from None
        if high < low or step < 1:
            raise ValueError(f"not a CPU list: {text.strip()!r}")
        cpus.update(range(low, high + 1, step))
    return cpus


def node_cpus(node: int, root: Path = NODE_ROOT) -> set[int]:
    """The CPUs of NUMA node ``node``, from ``<root>/node<N>/cpulist``."""
    path = root / f"node{node}" / "cpulist"
    try:
        cpus = parse_cpulist(path.read_text())
    except FileNotFoundError:
        nodes = sorted(p.name for p in root.glob("node[0-9]*")) if root.is_dir() else []
        raise HostError(f"NUMA node {node} does not exist (no {path}); this machine has "
                        f"{', '.join(nodes) or 'no NUMA nodes in sysfs'}: see `lscpu`, or "
                        "leave --numa-node out") from None
    if not cpus:
        raise HostError(f"NUMA node {node} has no CPUs ({path} is empty): pick a node with "
                        "CPUs (`lscpu`), e.g. the RDMA device's "
                        "(/sys/class/infiniband/<dev>/device/numa_node)")
    return cpus


def pin_to_node(node: int, root: Path = NODE_ROOT) -> set[int]:
    """Run this process on NUMA node ``node``'s CPUs only; returns those CPUs."""
    cpus = node_cpus(node, root)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as error:
        raise HostError(f"cannot pin to the CPUs of NUMA node {node} ({sorted(cpus)}): "
                        f"{error.strerror}; check the cgroup's cpuset (`taskset -p $$`) or "
                        "leave --numa-node out") from None
    return cpus
