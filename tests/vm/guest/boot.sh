#!/bin/sh
# PID 1 of the luksbench test VM, baked into the cached image as /sbin/luksbench-vm-init.
# Deliberately tiny (a change here rebuilds the image): find the per-run io disk by its virtio
# serial, mount it and hand over to its init.sh, which does everything else. Powers off if that
# fails, so the host never waits for a hung guest longer than its timeout.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
io=
for block in /sys/block/vd*; do
    [ "$(cat "$block/serial" 2>/dev/null)" = luksbench-io ] && io=/dev/${block##*/}
done
mkdir -p /mnt/io
if [ -n "$io" ] && mount "$io" /mnt/io && [ -f /mnt/io/guest/init.sh ]; then
    exec /bin/sh /mnt/io/guest/init.sh
fi
echo "luksbench-vm-init: no io disk with guest/init.sh (serial luksbench-io: '${io}')" >&2
echo o >/proc/sysrq-trigger
sleep 30
