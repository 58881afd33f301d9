"""The VM test box: a Debian guest with a real dm-crypt/MD kernel, booted under qemu (TCG).

The development and CI machines have no device-mapper and no MD, so the kernel backend's real
path (loop/virtio disks -> dm-crypt -> MD -> fs) can only run inside a VM. This harness

1. builds a minimal guest from Debian packages with mmdebstrap (kernel + modules, python3, fio,
   cryptsetup, mdadm, ...), cached under ``cache_dir()/<key>``; the key hashes the package list,
   the guest's init script and HARNESS_VERSION, so a change rebuilds it;
2. for each run, makes an ext4 "io" disk holding the project's ``src/``, the guest driver, the
   host-side plan files and an empty ``results/`` directory, plus four sparse scratch disks;
3. boots ``qemu-system-x86_64 -accel tcg`` with the built kernel and initrd, the cached root image
   as a throw-away snapshot, no network; the guest's init runs ``guest/driver.py``, which drives
   the project's own ``luksbench testbox`` commands and powers off;
4. copies ``results/`` back from the io disk with ``debugfs rdump`` (no mount on the host).

Run it from the repository: ``python tests/vm/harness.py image`` (build or reuse the image),
``python tests/vm/harness.py run --out DIR [--plan tests/vm/plans/legacy.json ...]``.
Needs root (mmdebstrap in root mode), mmdebstrap, qemu-system-x86_64, mke2fs and debugfs.
Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESS_VERSION = 1
SUITE = "bookworm"
# What the guest needs: the kernel with dm-crypt/MD modules (and an initramfs to find virtio
# disks), the tools luksbench's kernel backend calls, python3 for the project's code, udev for
# stable by-id names and python3-venv for a wheelhouse install (snakemake inside the guest).
PACKAGES = (
    "linux-image-amd64",
    "initramfs-tools",
    "kmod",
    "udev",
    "util-linux",
    "mount",
    "e2fsprogs",
    "xfsprogs",
    "cryptsetup-bin",
    "dmsetup",
    "mdadm",
    "fio",
    "python3",
    "python3-venv",
    "procps",
)
# Drivers a headless VM never loads: dropped to keep the image (and mke2fs -d) small.
PRUNED_MODULE_DIRS = (
    "drivers/gpu",
    "drivers/media",
    "drivers/net/wireless",
    "drivers/net/ethernet",
    "drivers/infiniband",
    "drivers/staging",
    "drivers/iio",
    "drivers/bluetooth",
    "drivers/isdn",
    "drivers/usb",
    "drivers/hid",
    "drivers/input",
    "sound",
    "net/wireless",
    "net/mac80211",
    "net/bluetooth",
)
ROOT_IMAGE_MIB = 4096
IO_IMAGE_MIB = 1024
SCRATCH_DISKS = 4
SCRATCH_DISK_MIB = 256
# The ``ceph`` variant adds a monitor, OSDs and the clients (Ceph 16.2 in Debian 12, about 212 MB
# installed) for the cases that build a throwaway cluster; the default guest stays without them.
CEPH_PACKAGES = ("ceph-mon", "ceph-osd", "ceph-common")
VARIANT_PACKAGES = {"base": (), "workflow": (), "ceph": CEPH_PACKAGES}
# An OSD needs about 1.5 GB resident (osd_memory_target at its floor): a ceph case boots with
# at least this much memory.
CEPH_MEM_MIB = 6144
GUEST_DIR = Path(__file__).parent / "guest"
PLANS_DIR = Path(__file__).parent / "plans"
REPO_DIR = Path(__file__).resolve().parents[2]
INIT_IN_IMAGE = "/sbin/luksbench-vm-init"
REQUIREMENTS = "envs/requirements.txt"
GUEST_VENV = "/opt/luksbench-venv"


class VMBoxError(RuntimeError):
    """The VM test box could not be built or run; the message says which step and why."""


def log(msg: str) -> None:
    print(f"vmbox: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """LUKSBENCH_VMBOX_CACHE, else /var/cache/luksbench-vmbox as root, else ~/.cache/..."""
    if os.environ.get("LUKSBENCH_VMBOX_CACHE"):
        return Path(os.environ["LUKSBENCH_VMBOX_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/luksbench-vmbox")
    return Path.home() / ".cache/luksbench/vmbox"


def missing_tools() -> list[str]:
    """Host tools the harness needs, with the Debian package that provides each."""
    need = {
        "mmdebstrap": "mmdebstrap",
        "qemu-system-x86_64": "qemu-system-x86",
        "mke2fs": "e2fsprogs",
        "debugfs": "e2fsprogs",
    }
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [f"{tool} ({pkg})" for tool, pkg in need.items() if not shutil.which(tool, path=path)]


def workflow_packages() -> list[str]:
    """The Python packages the workflow needs (pyproject extras analysis + workflow), unpinned:
    envs/requirements.txt pins them as a constraints file."""
    import tomllib

    extras = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    return sorted({*extras["analysis"], *extras["workflow"]})


def image_key(variant: str = "base") -> str:
    """``base``: the system; ``workflow``: plus a venv with the workflow's Python stack;
    ``ceph``: plus Ceph's monitor, OSD and clients."""
    if variant not in VARIANT_PACKAGES:
        raise VMBoxError(
            f"image variant must be one of {sorted(VARIANT_PACKAGES)}, not {variant!r}"
        )
    h = hashlib.sha256()
    h.update(f"v{HARNESS_VERSION} {SUITE} {variant} {ROOT_IMAGE_MIB}\n".encode())
    h.update(("\n".join(PACKAGES) + "\n" + "\n".join(PRUNED_MODULE_DIRS) + "\n").encode())
    h.update((GUEST_DIR / "boot.sh").read_bytes())
    h.update((GUEST_DIR / "initramfs-hook.sh").read_bytes())
    h.update(os.environ.get("LUKSBENCH_VMBOX_MIRROR", "").encode())
    if variant == "workflow":
        h.update((REPO_DIR / REQUIREMENTS).read_bytes())
        h.update(" ".join(workflow_packages()).encode())
    if VARIANT_PACKAGES[variant]:
        h.update(("\n".join(VARIANT_PACKAGES[variant]) + "\n").encode())
    return f"{variant}-{h.hexdigest()[:16]}"


def _run(
    argv: list[str], what: str, timeout: float = 1800, **kwargs
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
    except FileNotFoundError as exc:
        raise VMBoxError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise VMBoxError(f"{what}: timed out after {timeout} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-30:]
        raise VMBoxError(
            f"{what}: `{' '.join(argv[:6])} ...` exited {proc.returncode}:\n" + "\n".join(tail)
        )
    return proc


# --- the cached guest image ----------------------------------------------------------------------


def build_wheelhouse(dest: Path) -> Path:
    """Wheels of the workflow's Python stack at the pinned versions (sdist-only pins are built
    here), for the guest, which has no network. Made with the host's pip: same Python (3.11) and
    platform (Debian 12, x86_64) as the guest."""
    if (dest / ".complete").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    python = REPO_DIR / ".venv/bin/python"
    python = str(python) if python.exists() else sys.executable
    log(f"building the wheelhouse {dest} ({', '.join(workflow_packages())})")
    _run(
        [
            python,
            "-m",
            "pip",
            "wheel",
            "-q",
            "-w",
            str(dest),
            "-c",
            str(REPO_DIR / REQUIREMENTS),
            *workflow_packages(),
        ],
        "pip wheel (wheelhouse for the guest)",
    )
    shutil.copy2(REPO_DIR / REQUIREMENTS, dest / "requirements.txt")
    (dest / ".complete").write_text(" ".join(workflow_packages()) + "\n")
    return dest


def build_image(cache: Path | None = None, force: bool = False, variant: str = "base") -> Path:
    """The cached image directory (vmlinuz, initrd.img, rootfs.img, image.json); built if missing.

    Built in ``<cache>/<key>.tmp`` and renamed into place, so an interrupted build never leaves a
    half image that a later run would trust. Older keys are removed.
    """
    if os.geteuid() != 0:
        raise VMBoxError("building the guest image needs root (mmdebstrap --mode=root, mke2fs -d)")
    missing = missing_tools()
    if missing:
        raise VMBoxError(
            "missing host tools: "
            + ", ".join(missing)
            + "; apt-get install mmdebstrap qemu-system-x86 e2fsprogs"
        )
    cache = Path(cache or cache_dir())
    key = image_key(variant)
    final = cache / key
    if (final / "image.json").is_file() and not force:
        return final
    cache.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache: a caller that finds a build under way (the test session's
    # background build) waits for it and then reuses its image.
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "image.json").is_file() and not force:
            return final
        return _build_image(cache, key, variant)


def _unmount_under(path: Path) -> None:
    """Unmount (lazily, deepest first) whatever is mounted below ``path``."""
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    inside = [p for p in points if p.startswith(f"{path}/")]
    for point in sorted(inside, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _build_image(cache: Path, key: str, variant: str) -> Path:
    """Build the image of ``key`` in ``<cache>/<key>.tmp`` and rename it into place."""
    final = cache / key
    work = cache / f"{key}.tmp"
    _unmount_under(work)  # a build stopped mid-hook may leave the tree's proc/sys/dev mounted
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    tree = work / "tree"
    t0 = time.monotonic()
    packages = (*PACKAGES, *VARIANT_PACKAGES[variant])
    log(f"building the guest image {key} in {work} (Debian {SUITE}, {len(packages)} packages)")
    prune = " ".join(f'"$1"/usr/lib/modules/*/kernel/{d}' for d in PRUNED_MODULE_DIRS)
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        "--include=" + ",".join(packages),
        # No documentation, manuals or translations in a throw-away guest.
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        # Before the kernel is installed, so that its initramfs is built small.
        '--essential-hook=mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/etc/initramfs-tools/hooks" '
        '&& echo MODULES=list >"$1/etc/initramfs-tools/conf.d/luksbench.conf"',
        f"--essential-hook=upload {GUEST_DIR / 'initramfs-hook.sh'} /etc/initramfs-tools/hooks/luksbench",
        '--essential-hook=chmod 0755 "$1/etc/initramfs-tools/hooks/luksbench"',
        f"--customize-hook=rm -rf {prune}",
        "--customize-hook=chroot \"$1\" sh -c 'depmod -a $(ls /usr/lib/modules)'",
        f"--customize-hook=upload {GUEST_DIR / 'boot.sh'} {INIT_IN_IMAGE}",
        f'--customize-hook=chmod 0755 "$1{INIT_IN_IMAGE}"',
        '--customize-hook=echo luksbench-vm >"$1/etc/hostname"',
        "--customize-hook=chroot \"$1\" dpkg-query -W -f '${Package} ${Version}\\n' "
        '>"$1/luksbench-packages.txt"',
    ]
    if variant == "workflow":
        wheels = build_wheelhouse(work / "wheelhouse")
        wanted = " ".join(workflow_packages())
        argv += [
            '--customize-hook=mkdir -p "$1/tmp/wheelhouse"',
            f"--customize-hook=sync-in {wheels} /tmp/wheelhouse",
            f'--customize-hook=chroot "$1" python3 -m venv {GUEST_VENV}',
            f'--customize-hook=chroot "$1" {GUEST_VENV}/bin/python -m pip install -q '
            f"--no-index --find-links /tmp/wheelhouse -c /tmp/wheelhouse/requirements.txt {wanted}",
            f'--customize-hook=chroot "$1" {GUEST_VENV}/bin/python -m pip freeze '
            f'>"$1/luksbench-venv.txt"',
            '--customize-hook=rm -rf "$1/tmp/wheelhouse"',
        ]
    argv += [SUITE, str(tree)]
    mirror = os.environ.get("LUKSBENCH_VMBOX_MIRROR")
    if mirror:
        argv.append(mirror)
    _run(argv, "mmdebstrap", timeout=3600)
    t_bootstrap = time.monotonic() - t0
    boot = tree / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"))
    initrds = sorted(boot.glob("initrd.img-*"))
    if not kernels or not initrds:
        raise VMBoxError(f"mmdebstrap left no kernel/initrd in {boot}: {sorted(os.listdir(boot))}")
    shutil.copy2(kernels[-1], work / "vmlinuz")
    shutil.copy2(initrds[-1], work / "initrd.img")
    installed = (tree / "luksbench-packages.txt").read_text()
    venv = tree / "luksbench-venv.txt"
    venv_packages = venv.read_text().splitlines() if venv.exists() else []
    rootfs = work / "rootfs.img"
    _run(
        [
            "mke2fs",
            "-q",
            "-t",
            "ext4",
            "-L",
            "luksbench-root",
            "-d",
            str(tree),
            "-E",
            "root_owner=0:0",
            str(rootfs),
            f"{ROOT_IMAGE_MIB}M",
        ],
        "mke2fs -d (root image)",
    )
    tree_bytes = sum(
        p.lstat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
    )
    shutil.rmtree(tree)
    shutil.rmtree(work / "wheelhouse", ignore_errors=True)
    info = {
        "key": key,
        "harness_version": HARNESS_VERSION,
        "suite": SUITE,
        "packages_requested": list(packages),
        "kernel": kernels[-1].name.removeprefix("vmlinuz-"),
        "packages_installed": installed.splitlines(),
        "variant": variant,
        "venv": GUEST_VENV if variant == "workflow" else None,
        "venv_packages": venv_packages,
        "tree_bytes": tree_bytes,
        "build_seconds": round(time.monotonic() - t0, 1),
        "bootstrap_seconds": round(t_bootstrap, 1),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (work / "image.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(work, final)
    for old in cache.iterdir():  # one image per variant: each is 0.6-1.5 GB
        if old.name != key and old.name.startswith(f"{variant}-") and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    log(f"guest image {key} ready in {info['build_seconds']} s ({tree_bytes / 2**20:.0f} MiB tree)")
    return final


# --- one boot ------------------------------------------------------------------------------------


def _stage_io(stage: Path, plans: list[Path], job: dict) -> None:
    """The io disk's content: the project's source, the driver, the plan files, the job."""
    rev = os.environ.get("LUKSBENCH_VMBOX_SRC_REV")
    if rev:  # a committed revision instead of the working tree (e.g. HEAD while src/ is mid-edit)
        archive = subprocess.run(
            ["git", "-C", str(REPO_DIR), "archive", rev, "src"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(stage)], input=archive, check=True)
    else:
        shutil.copytree(
            REPO_DIR / "src",
            stage / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
    shutil.copytree(GUEST_DIR, stage / "guest", ignore=shutil.ignore_patterns("__pycache__"))
    (stage / "plans").mkdir()
    names = []
    for plan in plans:
        shutil.copy2(plan, stage / "plans" / plan.name)
        names.append(plan.name)
    for extra in job.pop("copy", []):  # (host path, name on the io disk)
        src, name = Path(extra[0]), extra[1]
        if src.is_dir():
            shutil.copytree(src, stage / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, stage / name)
    (stage / "results").mkdir()
    (stage / "job.json").write_text(json.dumps({**job, "plans": names}, indent=2) + "\n")


# qemu 7.2's TCG runs numpy's AVX2 kernels wrongly: with the workflow image, a parallel ingest
# died with a general protection fault in numpy's _multiarray_umath. The workflow boots without
# AVX (numpy falls back to its SSE4.2 baseline; dm-crypt still has AES-NI).
CPU_BASE = "max"
CPU_WORKFLOW = "max,avx=off,avx2=off,fma=off,f16c=off,vaes=off,vpclmulqdq=off"


def qemu_argv(
    image: Path,
    io_disk: Path,
    scratch: list[Path],
    console: Path,
    smp: int,
    mem_mib: int,
    cpu: str = CPU_BASE,
) -> list[str]:
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-cpu",
        cpu,
        "-smp",
        str(smp),
        "-m",
        str(mem_mib),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-nic",
        "none",
        "-serial",
        f"file:{console}",
        "-kernel",
        str(image / "vmlinuz"),
        "-initrd",
        str(image / "initrd.img"),
        "-append",
        f"console=ttyS0 root=/dev/vda rw init={INIT_IN_IMAGE} panic=-1 loglevel=4 "
        "systemd.show_status=0 net.ifnames=0",
        # The cached root image is never written: snapshot=on keeps changes in a temp overlay.
        "-drive",
        f"file={image / 'rootfs.img'},if=none,id=root,format=raw,snapshot=on",
        "-device",
        "virtio-blk-pci,drive=root,serial=luksbench-root",
    ]
    for i, disk in enumerate(scratch):
        argv += [
            "-drive",
            f"file={disk},if=none,id=scratch{i},format=raw,cache=unsafe,discard=unmap",
            "-device",
            f"virtio-blk-pci,drive=scratch{i},serial=luksbench-scratch{i}",
        ]
    argv += [
        "-drive",
        f"file={io_disk},if=none,id=io,format=raw",
        "-device",
        "virtio-blk-pci,drive=io,serial=luksbench-io",
    ]
    return argv


def needs_workflow(plans: list[Path]) -> bool:
    """A case with a ``snakemake`` block runs the workflow: the workflow image and a copy of it
    (``"image": "workflow"`` asks for that image alone, e.g. for a ``commands`` case)."""
    cases = [json.loads(Path(p).read_text()) for p in plans]
    return any("snakemake" in c or c.get("image") == "workflow" for c in cases)


def image_variant(plans: list[Path]) -> str:
    """The image the cases need: ``workflow`` for a snakemake case (or ``"image": "workflow"``),
    ``ceph`` for a case with ``"image": "ceph"``, else ``base``; one boot uses one image."""
    if needs_workflow(plans):
        return "workflow"
    asked = {json.loads(Path(p).read_text()).get("image", "base") for p in plans}
    if len(asked) > 1:
        raise VMBoxError(
            f"cases asking for different images ({sorted(asked)}) need their own boots"
        )
    variant = asked.pop() if asked else "base"
    if variant not in VARIANT_PACKAGES:
        raise VMBoxError(f"case image {variant!r} is not one of {sorted(VARIANT_PACKAGES)}")
    return variant


def case_resources(plans: list[Path], mem_mib: int, disk_mib: int) -> tuple[int, int]:
    """(memory, scratch disk size) for one boot: the largest any case asks for (``mem_mib``,
    ``disk_mib`` in its file), at least the given ones; a ceph case at least CEPH_MEM_MIB."""
    cases = [json.loads(Path(p).read_text()) for p in plans]
    mem = max([mem_mib, *(int(c.get("mem_mib", 0)) for c in cases)])
    if any(c.get("image") == "ceph" for c in cases):
        mem = max(mem, CEPH_MEM_MIB)
    disk = max([disk_mib, *(int(c.get("disk_mib", 0)) for c in cases)])
    return mem, disk


def run_guest(
    out: Path,
    plans: list[Path] | None = None,
    *,
    job: dict | None = None,
    workflow_dir: Path | None = None,
    image: Path | None = None,
    timeout: float = 1200,
    smp: int = 2,
    mem_mib: int = 2048,
    io_mib: int = IO_IMAGE_MIB,
    disk_mib: int = SCRATCH_DISK_MIB,
) -> Path:
    """Boot the guest once for ``plans`` (default: every file in plans/); results land in ``out``.

    Returns ``out``, holding ``results/`` (what the guest wrote), ``console.log`` and
    ``boot.json`` (timings, the qemu command line). Raises VMBoxError when the guest does not
    power off within ``timeout`` seconds or leaves no summary.
    """
    plans = sorted(plans) if plans else sorted(PLANS_DIR.glob("*.json"))
    job = dict(job or {})
    if needs_workflow(plans):
        if workflow_dir is not None:
            job.setdefault("copy", []).append((str(workflow_dir), "workflow"))
        elif any("snakemake" in json.loads(Path(p).read_text()) for p in plans):
            raise VMBoxError("a snakemake case needs workflow_dir (a copy of the workflow)")
        job["venv"] = GUEST_VENV
    image = image or build_image(variant=image_variant(plans))
    mem_mib, disk_mib = case_resources(plans, mem_mib, disk_mib)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    console = out / "console.log"
    with tempfile.TemporaryDirectory(prefix="luksbench-vmbox-") as tmp:
        tmp = Path(tmp)
        stage = tmp / "io"
        stage.mkdir()
        _stage_io(stage, plans, job)
        io_disk = tmp / "io.img"
        _run(
            [
                "mke2fs",
                "-q",
                "-t",
                "ext4",
                "-L",
                "luksbench-io",
                "-d",
                str(stage),
                "-E",
                "root_owner=0:0",
                str(io_disk),
                f"{io_mib}M",
            ],
            "mke2fs -d (io disk)",
        )
        scratch = []
        for i in range(SCRATCH_DISKS):
            disk = tmp / f"scratch{i}.img"
            with open(disk, "wb") as f:
                f.truncate(disk_mib * 2**20)
            scratch.append(disk)
        cpu = CPU_WORKFLOW if "venv" in job else CPU_BASE
        argv = qemu_argv(image, io_disk, scratch, console, smp, mem_mib, cpu)
        log(f"booting the guest ({len(plans)} plan file(s)); console: {console}")
        t0 = time.monotonic()
        env = {**os.environ, "TMPDIR": str(tmp)}  # the snapshot overlay goes away with tmp
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            qemu_out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            qemu_out, _ = proc.communicate()
            raise VMBoxError(
                f"the guest did not power off within {timeout} s; console tail:\n" + _tail(console)
            ) from None
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            raise VMBoxError(
                f"qemu exited {proc.returncode}: {qemu_out.strip()}\n" + _tail(console)
            )
        log(f"guest powered off after {seconds:.1f} s")
        shutil.rmtree(out / "results", ignore_errors=True)
        _run(["debugfs", "-R", f"rdump /results {out}", str(io_disk)], "debugfs rdump (results)")
    boot = {
        "boot_to_poweroff_s": round(seconds, 1),
        "image": json.loads((image / "image.json").read_text()),
        "qemu_argv": argv,
        "qemu_output": qemu_out,
        "plans": [p.name for p in plans],
        "mem_mib": mem_mib,
        "scratch_disk_mib": disk_mib,
    }
    (out / "boot.json").write_text(json.dumps(boot, indent=2) + "\n")
    if not (out / "results" / "summary.json").is_file():
        raise VMBoxError("the guest left no results/summary.json; console tail:\n" + _tail(console))
    return out


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "image", help="build the guest image (or reuse the cached one); print its dir"
    )
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.add_argument("--variant", choices=sorted(VARIANT_PACKAGES), default="base")
    p = sub.add_parser("run", help="boot the guest once for the given plan files")
    p.add_argument("--out", required=True, help="results directory on the host")
    p.add_argument("--plan", action="append", type=Path, help="plan file (default: all in plans/)")
    p.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args(argv)
    try:
        if args.command == "image":
            print(build_image(force=args.force, variant=args.variant))
        else:
            plans = sorted(args.plan) if args.plan else sorted(PLANS_DIR.glob("*.json"))
            workflow_dir = None
            tmp = tempfile.TemporaryDirectory(prefix="luksbench-vmbox-workflow-")
            if needs_workflow(plans):
                sys.path.insert(0, str(REPO_DIR / "tests"))
                from testkit.workflow import copy_workflow  # the suite's list of workflow files

                workflow_dir = copy_workflow(Path(tmp.name) / "workflow")
            with tmp:
                out = run_guest(
                    Path(args.out), plans, workflow_dir=workflow_dir, timeout=args.timeout
                )
            summary = json.loads((out / "results/summary.json").read_text())
            print(json.dumps({k: v for k, v in summary.items() if k != "cases"}, indent=2))
            for name, case in summary.get("cases", {}).items():
                print(f"{name}: {'ok' if case.get('ok') else 'FAILED'} {case.get('problems', [])}")
            return 0 if summary.get("ok") else 1
    except VMBoxError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
