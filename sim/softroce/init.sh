#!/bin/sh
# PID 1 of the Soft-RoCE guest (sim/softroce). Mounts, eth0 and rxe0, one
# script from the host, power off. It talks to the host on the console:
#   === softroce: init UPTIME ===      the kernel handed over to this init
#   === softroce: ready UPTIME ===     eth0 and rxe0 are up
#   === softroce: script ===           the script's output follows
#   === exit N ===                     the script exited with N
#   === softroce: failed: WHAT ===     a setup step failed; no script ran
# Shares (virtio-9p): "repo" (read-only) at /mnt/repo, the script's working
# directory; "job" at /mnt/job with config (shell variables SOFTROCE_*) and
# script.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

say() { echo "=== softroce: $* ==="; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
power_off() {
    sync
    echo o > /proc/sysrq-trigger
    sleep 10
    echo b > /proc/sysrq-trigger
}
fail() { say "failed: $*"; power_off; exit 1; }
step() { "$@" || fail "$*"; }

# The initramfs moves /proc, /sys, /dev and /run over; mount what is missing.
mount_once() { mountpoint -q "$2" || step mount -t "$1" "$1" "$2"; }
mount_once proc /proc
mount_once sysfs /sys
mount_once devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount_once devpts /dev/pts
mount_once tmpfs /dev/shm
mount_once tmpfs /run
mount_once tmpfs /tmp
exec </dev/null >/dev/console 2>&1
dmesg -n 1
say "init $(uptime_s)"

step modprobe -a virtio_net 9pnet_virtio 9p rdma_rxe ib_uverbs rdma_ucm
mkdir -p /mnt/repo /mnt/job
step mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro repo /mnt/repo
step mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 job /mnt/job
[ -r /mnt/job/config ] || fail "no /mnt/job/config"
. /mnt/job/config

hostname "${SOFTROCE_HOSTNAME:-softroce}"
step ip link set lo up
step ip link set eth0 mtu "${SOFTROCE_MTU:-9000}" up
step ip addr add "${SOFTROCE_IP:-10.77.0.1/24}" dev eth0
if [ -n "$SOFTROCE_NEIGHBOUR_IP" ]; then
    step ip neigh replace "$SOFTROCE_NEIGHBOUR_IP" lladdr "$SOFTROCE_NEIGHBOUR_MAC" \
        dev eth0 nud permanent
fi
step rdma link add rxe0 type rxe netdev eth0
say "ready $(uptime_s)"

cd /mnt/repo || fail "cd /mnt/repo"
export HOME=/root LANG=C.UTF-8 TERM=dumb PYTHONPATH=/mnt/repo PYTHONDONTWRITEBYTECODE=1
say "script"
/mnt/job/script
echo "=== exit $? ==="
power_off
