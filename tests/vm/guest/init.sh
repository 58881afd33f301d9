#!/bin/sh
# Stage 2 of the VM's init, from the io disk (boot.sh in the image mounted it on /mnt/io).
# Mounts what is missing, starts udev (stable /dev/disk/by-id names; cryptsetup and mdadm behave
# as on a real box), runs driver.py and powers the VM off whatever happens.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LANG=C.UTF-8 HOME=/root TERM=dumb
mkdir -p /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts devpts /dev/pts
mountpoint -q /run || mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
hostname luksbench-vm
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd

echo "luksbench-vm-init: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s; starting udev"
/lib/systemd/systemd-udevd --daemon
# Block devices only: the initramfs loaded the virtio drivers; a full coldplug costs ~10 s in TCG.
udevadm trigger --action=add --subsystem-match=block
udevadm settle --timeout=60
echo "luksbench-vm-init: udev settled, up $(cut -d' ' -f1 /proc/uptime) s"

python3 /mnt/io/guest/driver.py /mnt/io
echo "luksbench-vm-init: driver exited $?, up $(cut -d' ' -f1 /proc/uptime) s"
sync
mount -o remount,ro /mnt/io  # not umount: this script runs from it
echo "luksbench-vm-init: powering off"
echo u >/proc/sysrq-trigger  # remount read-only: no I/O in flight when the power goes
sleep 1
echo o >/proc/sysrq-trigger
sleep 30
