"""The two ways the test box builds stacks: kernel (loop, dm-crypt, md, filesystems) and
userspace (qemu-storage-daemon over FUSE), and how one is chosen."""
