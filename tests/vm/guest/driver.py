"""Inside the luksbench test VM: run the project's own test-box commands on real dm-crypt and MD.

Started by the VM's init as ``python3 driver.py /mnt/io``. The io disk holds ``src/`` (the
project's source, put on PYTHONPATH), ``plans/*.json`` (the cases, written on the host),
``job.json`` (which cases, options) and ``results/`` (everything written here goes back to the
host). Standard library only: the guest has python3 and the system tools, nothing else.

A case file (``tests/vm/plans/NAME.json``)::

    {
      "description": "what this case proves",
      "plan": {...},            # a luksbench plan without run/host/scratch_dir (filled in here);
                                # a device {"vm_disk": N, ...} becomes {"path": <scratch disk N>, ...}
      "setup": [[argv...]],     # commands run before the steps ({disk0}..{disk3}, {run}, ...)
      "steps": ["capture-env", "benchmark-ciphers", "stack-up", "run-fio", "stack-down"],
      "expect": {"stack_up": "ok"}  or  {"stack_up": {"refused": "regex"}}
    }

A case with ``snakemake`` runs the workflow (see run_snakemake_case); one with ``commands`` just
runs them (a debugging aid).

For every case the driver writes ``results/<case>/``: plan.json, env.json, stacks.json,
state.json (a copy taken while the stacks were up: paths and names only), raw/ (the fio tree),
teardown.json, captures/{before,up,during,after}/ (dmsetup table, /proc/mdstat, losetup, lsblk,
mounts, blkid), logs/ (stderr of every command), and case.json (steps, exit codes, times, what
was left behind). ``results/summary.json`` indexes the cases.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

IO = Path(sys.argv[1] if len(sys.argv) > 1 else "/mnt/io")
RESULTS = IO / "results"
SRC = IO / "src"
WORK = Path("/var/lib/luksbench")  # on the VM's root (a throw-away snapshot)
HOST = "luksbench-vm"
MODULES = ("loop", "dm_mod", "dm_crypt", "raid0", "raid456", "linear", "algif_skcipher", "xfs")
SCRATCH_DISKS = 4
DEFAULT_STEPS = ("capture-env", "stack-up", "run-fio", "stack-down")
ENV = {
    **os.environ,
    "PYTHONPATH": str(SRC),
    "PYTHONDONTWRITEBYTECODE": "1",
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
}
T0 = time.monotonic()


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] driver: {msg}"
    print(line, flush=True)
    with open(RESULTS / "driver.log", "a") as f:
        f.write(line + "\n")


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def sh(argv: list[str], timeout: float = 120) -> dict:
    """Run a system tool (setup, captures): exit code and output, never an exception."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=ENV
        )
        return {"argv": argv, "exit": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"argv": argv, "exit": None, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}"}


def loopback_up() -> str:
    """Bring ``lo`` up (the guest has no network and no init that does it): Jupyter kernels talk
    to papermill over 127.0.0.1. SIOCGIFFLAGS/SIOCSIFFLAGS, as iproute2 is not in the image."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifreq))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifreq))[1]
    return "up" if flags & 0x1 else "down"


# --- disks ---------------------------------------------------------------------------------------


def scratch_disks() -> list[dict]:
    """The scratch disks by their virtio serial: a stable by-id path and the kernel name."""
    disks = []
    for i in range(SCRATCH_DISKS):
        serial = f"luksbench-scratch{i}"
        by_id = Path(f"/dev/disk/by-id/virtio-{serial}")
        kname = None
        for block in sorted(Path("/sys/block").glob("vd*")):
            with contextlib.suppress(OSError):
                if (block / "serial").read_text().strip() == serial:
                    kname = block.name
        disks.append(
            {
                "index": i,
                "serial": serial,
                "by_id": str(by_id) if by_id.exists() else None,
                "dev": f"/dev/{kname}" if kname else None,
            }
        )
    return disks


def fingerprint(dev: str) -> str:
    """sha256 of the first and last MiB: where every signature (LUKS, MD, ext4, xfs) lives."""
    h = hashlib.sha256()
    fd = os.open(dev, os.O_RDONLY)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        for offset in (0, max(0, size - 2**20)):
            h.update(os.pread(fd, 2**20, offset))
    finally:
        os.close(fd)
    return h.hexdigest()


def reset_disk(dev: str) -> dict:
    """Zero the first and last 8 MiB (a fresh disk for the next case)."""
    fd = os.open(dev, os.O_WRONLY)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        zeros = b"\0" * 2**20
        for start in (0, max(0, size - 8 * 2**20)):
            for k in range(8):
                os.pwrite(fd, zeros, start + k * 2**20)
        os.fsync(fd)
    finally:
        os.close(fd)
    return sh(["blockdev", "--flushbufs", dev])


# --- captures ------------------------------------------------------------------------------------

CAPTURES = {
    "dmsetup-table.txt": ["dmsetup", "table"],
    "dmsetup-ls.txt": ["dmsetup", "ls"],
    "losetup.txt": ["losetup", "-l"],
    "losetup.json": ["losetup", "-J", "-l"],
    "lsblk.txt": ["lsblk", "-o", "NAME,TYPE,SIZE,FSTYPE,MOUNTPOINT"],
    "lsblk.json": ["lsblk", "-J", "-p", "-o", "NAME,KNAME,TYPE,SIZE,FSTYPE,MOUNTPOINT,PKNAME"],
    "blkid.txt": ["blkid"],
}


CEPH_DAEMONS = ("ceph-mon", "ceph-osd", "ceph-mgr", "ceph-mds")


def ceph_processes() -> list[dict]:
    """Running Ceph daemons (a cluster a case built must be gone after its stack-down)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                if comm in CEPH_DAEMONS:
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                    found.append(
                        {"pid": int(entry), "comm": comm, "argv": [a.decode() for a in argv if a]}
                    )
    return sorted(found, key=lambda d: d["pid"])


def capture(where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    write_json(where / "ceph-daemons.json", ceph_processes())
    for name, argv in CAPTURES.items():
        r = sh(argv)
        text = r["stdout"]
        if r["exit"] not in (0, 2) or r["stderr"].strip():  # blkid exits 2 when it finds nothing
            text += f"\n# {' '.join(argv)}: exit {r['exit']} {r['stderr'].strip()}\n"
        (where / name).write_text(text)
    for src, name in (("/proc/mdstat", "mdstat.txt"), ("/proc/self/mounts", "mounts.txt")):
        try:
            (where / name).write_text(Path(src).read_text())
        except OSError as exc:
            (where / name).write_text(f"# {src}: {exc}\n")


def leftovers() -> dict:
    """Kernel objects a luksbench run could have left: dm devices, md arrays, loops, mounts."""
    dm = sh(["dmsetup", "ls"])["stdout"]
    dm_names = [
        line.split()[0] for line in dm.splitlines() if line.strip() and "No devices" not in line
    ]
    md = re.findall(r"^(md\d+) :", Path("/proc/mdstat").read_text(), flags=re.M)
    loops = []
    with contextlib.suppress(json.JSONDecodeError):
        out = sh(["losetup", "-J", "-l"])["stdout"]
        loops = [d["name"] for d in json.loads(out or '{"loopdevices": []}')["loopdevices"]]
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[0].startswith(("/dev/mapper/", "/dev/md", "/dev/loop", "/dev/vd"))
        and line.split()[1] not in ("/", "/mnt/io")
    ]
    # The project's measurement lock: held until a clean stack-down; a left lock blocks every
    # later run on this box.
    locks = [str(p) for p in sorted(Path("/run/luksbench").glob("*.lock"))]
    ceph = [d["pid"] for d in ceph_processes()]
    found = {"dm": dm_names, "md": md, "loop": loops, "mounts": mounts, "locks": locks}
    return {**found, "ceph": ceph}


def force_clean(found: dict) -> list[dict]:
    """What a case left is removed here, so the next case starts clean (and it is recorded)."""
    done = [sh(["kill", "-9", str(pid)]) for pid in found.get("ceph", [])]
    done += [sh(["umount", "-l", m]) for m in found["mounts"]]
    done += [sh(["dmsetup", "remove", "--force", n]) for n in reversed(found["dm"])]
    done += [sh(["mdadm", "--stop", f"/dev/{m}"]) for m in found["md"]]
    done += [sh(["losetup", "-d", lo]) for lo in found["loop"]]
    done += [sh(["rm", "-f", lock]) for lock in found["locks"]]
    return done


# --- the project's commands ----------------------------------------------------------------------


def luksbench(args: list[str], logs: Path, step: str, timeout: float = 900) -> dict:
    """``python3 -m luksbench.cli ARGS`` with the io disk's src on PYTHONPATH."""
    argv = [sys.executable, "-m", "luksbench.cli", *args]
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"$ luksbench {' '.join(args)}")
    with open(logs / f"{step}.stdout", "w") as out, open(logs / f"{step}.stderr", "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=ENV, stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            err.write(f"\nvmbox driver: killed after {timeout} s\n")
    stderr = (logs / f"{step}.stderr").read_text(errors="replace")
    for line in stderr.splitlines()[-40:]:
        print(f"    {line}", flush=True)
    return {
        "step": step,
        "args": args,
        "exit": rc,
        "seconds": round(time.monotonic() - t0, 2),
        "stderr_tail": stderr.splitlines()[-15:],
    }


def run_fio_with_capture(args: list[str], logs: Path, during: Path, timeout: float = 1800) -> dict:
    """run-fio, with one capture taken while a fio process is running."""
    argv = [sys.executable, "-m", "luksbench.cli", *args]
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"$ luksbench {' '.join(args)}")
    with open(logs / "run-fio.stdout", "w") as out, open(logs / "run-fio.stderr", "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=ENV, stdin=subprocess.DEVNULL)
        rc, captured_at = wait_capturing_once(proc, t0, timeout, during)
    stderr = (logs / "run-fio.stderr").read_text(errors="replace")
    for line in stderr.splitlines()[-40:]:
        print(f"    {line}", flush=True)
    return {
        "step": "run-fio",
        "args": args,
        "exit": rc,
        "seconds": round(time.monotonic() - t0, 2),
        "during_capture_at_s": captured_at,
        "stderr_tail": stderr.splitlines()[-15:],
    }


def fio_running() -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if (
                    argv
                    and os.path.basename(argv[0]) == b"fio"
                    and any(a.startswith(b"--filename=") for a in argv)
                ):
                    return True
    return False


def wait_capturing_once(
    proc: subprocess.Popen, t0: float, timeout: float, during: Path
) -> tuple[int, float | None]:
    """Wait for ``proc`` (killed after ``timeout`` s from ``t0``), taking one capture into
    ``during`` while a fio process runs; its exit code and when the capture was taken."""
    captured_at = None
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        if captured_at is None and fio_running():
            capture(during)
            captured_at = round(time.monotonic() - t0, 2)
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(), captured_at


# --- one case ------------------------------------------------------------------------------------


def substitute(value, names: dict):
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    return value


def make_plan(name: str, case: dict, disks: list[dict]) -> dict:
    """The case's plan as the workflow would write it: run/host/scratch_dir filled, VM disks
    named by path, every layer with its defaults (the project's resolve_layer/resolve_devices);
    not checked here, so that stack-up's own checks are what refuses a bad plan."""
    sys.path.insert(0, str(SRC))
    from luksbench.testbox.planbuild import resolve_devices, resolve_layer

    plan = json.loads(json.dumps(case["plan"]))
    plan.setdefault("run", f"vm-{name}")
    plan.setdefault("host", HOST)
    plan["scratch_dir"] = str(WORK / "scratch" / name)
    plan["stacks"] = {n: resolve_layer(s, f"stacks.{n}") for n, s in plan["stacks"].items()}
    for dev_name, dev in (plan.get("devices") or {}).items():
        if isinstance(dev, dict) and "vm_disk" in dev:
            disk = disks[int(dev.pop("vm_disk"))]
            # by-id is the stable path a real box would name; "vd" asks for the kernel name.
            path = disk["dev"] if dev.pop("vm_path", "by-id") == "vd" else disk["by_id"]
            plan["devices"][dev_name] = {"path": path, **dev}
    plan["devices"] = resolve_devices(plan.get("devices"))
    return plan


def run_case(name: str, case: dict, disks: list[dict], job: dict) -> dict:
    out = RESULTS / name
    logs = out / "logs"
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"case": name, "description": case.get("description", ""), "steps": []}
    record["reset"] = [reset_disk(d["dev"])["exit"] for d in disks if d["dev"]]
    plan = make_plan(name, case, disks)
    names = {
        "run": plan["run"],
        "host": plan["host"],
        "scratch_dir": plan["scratch_dir"],
        **{f"disk{d['index']}": d["by_id"] or d["dev"] for d in disks},
        **{f"vd{d['index']}": d["dev"] for d in disks},
    }
    plan_path = out / "plan.json"
    write_json(plan_path, plan)
    state = WORK / "state" / f"{name}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    raw_host_dir = out / "raw" / plan["run"] / plan["host"]
    record["setup"] = []
    for argv in substitute(case.get("setup", []), names):
        r = sh(argv)
        record["setup"].append({k: r[k] for k in ("argv", "exit", "stderr")})
        log(f"setup $ {' '.join(argv)} -> exit {r['exit']} {r['stderr'].strip()[:200]}")
    capture(out / "captures/before")
    record["fingerprints_before"] = {d["serial"]: fingerprint(d["dev"]) for d in disks}

    plan_arg = ["--plan", str(plan_path)]
    for step in case.get("steps", DEFAULT_STEPS):
        if step == "capture-env":
            r = luksbench(
                ["testbox", "capture-env", *plan_arg, "--out", str(out / "env.json")], logs, step
            )
        elif step == "benchmark-ciphers":
            r = luksbench(
                [
                    "testbox",
                    "benchmark-ciphers",
                    *plan_arg,
                    "--out",
                    str(out / "cryptsetup-benchmark.txt"),
                    "--cipher",
                    "aes-xts-plain64",
                    "--key-size",
                    "512",
                ],
                logs,
                step,
            )
        elif step == "plan":
            r = luksbench(["plan", *plan_arg, "--check-devices"], logs, step)
        elif step == "stack-up":
            r = luksbench(
                [
                    "testbox",
                    "stack-up",
                    *plan_arg,
                    "--state",
                    str(state),
                    "--describe",
                    str(out / "stacks.json"),
                ],
                logs,
                step,
                timeout=float(case.get("stack_up_timeout_s", job.get("stack_up_timeout_s", 900))),
            )
            if state.exists():
                shutil.copy2(state, out / "state.json")
            capture(out / "captures/up")
        elif step == "run-fio":
            r = run_fio_with_capture(
                [
                    "testbox",
                    "run-fio",
                    *plan_arg,
                    "--state",
                    str(state),
                    "--raw-host-dir",
                    str(raw_host_dir),
                    "--manifest",
                    str(raw_host_dir / "fio/manifest.json"),
                    "--describe",
                    str(out / "stacks.json"),
                ],
                logs,
                out / "captures/during",
            )
        elif step == "stack-down":
            r = luksbench(
                [
                    "testbox",
                    "stack-down",
                    "--state",
                    str(state),
                    "--record",
                    str(out / "teardown.json"),
                ],
                logs,
                step,
            )
        else:
            r = {"step": step, "exit": None, "error": f"unknown step {step!r}"}
        record["steps"].append(r)
        log(f"{name}: {step} exit {r['exit']} in {r.get('seconds')} s")
        if step == "stack-up" and r["exit"] != 0:
            break  # nothing to measure or tear down (stack-up tears down what it built)

    if state.exists() and "stack-down" not in case.get("steps", DEFAULT_STEPS):
        # A stack-up that should have refused but built something: take it down with the project's
        # own command before looking for leftovers.
        r = luksbench(
            ["testbox", "stack-down", "--state", str(state)], logs, "stack-down-unexpected"
        )
        record["steps"].append(r)
    capture(out / "captures/after")
    record["fingerprints_after"] = {d["serial"]: fingerprint(d["dev"]) for d in disks}
    record["scratch_dir_after"] = (
        sorted(os.listdir(plan["scratch_dir"])) if os.path.isdir(plan["scratch_dir"]) else None
    )
    record["state_file_left"] = state.exists()
    # The case's own cleanup (e.g. a device its setup made) first; then anything else is a leftover.
    record["cleanup"] = [
        {k: r[k] for k in ("argv", "exit", "stderr")}
        for r in sh_each(substitute(case.get("cleanup", []), names))
    ]
    found = leftovers()
    record["leftovers"] = found
    if any(found.values()):
        log(f"{name}: LEFT BEHIND {found}; removing it so the next case starts clean")
        record["forced_cleanup"] = [
            {k: r[k] for k in ("argv", "exit", "stderr")} for r in force_clean(leftovers())
        ]
    if state.exists():
        record["forced_cleanup"] = [*record.get("forced_cleanup", []), sh(["rm", "-f", str(state)])]
    record["problems"] = problems(case, record)
    record["ok"] = not record["problems"]
    write_json(out / "case.json", record)
    return record


def run_snakemake_case(name: str, case: dict, disks: list[dict], job: dict) -> dict:
    """The whole workflow in the guest: ``snakemake --cores 1 TARGETS`` on a copy of the workflow
    (from the io disk), with the case's config on top of config/config.yaml. The workflow's own
    Python stack comes from the image's venv (built from a wheelhouse on the host)."""
    out = RESULTS / name
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"case": name, "description": case.get("description", ""), "steps": []}
    record["reset"] = [reset_disk(d["dev"])["exit"] for d in disks if d["dev"]]
    spec = case["snakemake"]
    workdir = out / "workflow"
    shutil.copytree(IO / "workflow", workdir)
    record["workflow_patches"] = patch_papermill_timeout(workdir, spec)
    config = json.loads(json.dumps(spec.get("config", {})))
    config.setdefault("run", f"vm-{name}")
    for dev_name, dev in (config.get("devices") or {}).items():
        if isinstance(dev, dict) and "vm_disk" in dev:
            disk = disks[int(dev.pop("vm_disk"))]
            path = disk["dev"] if dev.pop("vm_path", "by-id") == "vd" else disk["by_id"]
            config["devices"][dev_name] = {"path": path, **dev}
    write_json(out / "vm-config.json", config)
    venv = job["venv"]
    # The workflow calls `luksbench ...`: the project's CLI from the copied src, in the venv.
    wrapper = Path("/usr/local/bin/luksbench")
    wrapper.write_text(f'#!/bin/sh\nexec {venv}/bin/python -m luksbench.cli "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **ENV,
        "PATH": f"{venv}/bin:/usr/local/bin:{ENV['PATH']}",
        "PYTHONPATH": str(workdir / "src"),
        "MPLBACKEND": "Agg",
        "HOME": "/root",
    }
    capture(out / "captures/before")
    # Targets first: --configfile takes several values and would swallow them.
    argv = [
        f"{venv}/bin/snakemake",
        *spec.get("targets", ["all"]),
        "--cores",
        "1",
        "--configfile",
        str(out / "vm-config.json"),
    ]
    log(f"$ (cd {workdir} && {' '.join(argv)})")
    t0 = time.monotonic()
    timeout = float(spec.get("timeout_s", 3600))
    with open(out / "snakemake.log", "w") as log_file:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        rc, captured_at = wait_capturing_once(proc, t0, timeout, out / "captures/during")
    text = (out / "snakemake.log").read_text(errors="replace")
    for line in text.splitlines()[-30:]:
        print(f"    {line}", flush=True)
    record["steps"].append(
        {
            "step": "snakemake",
            "args": argv,
            "exit": rc,
            "seconds": round(time.monotonic() - t0, 2),
            "during_capture_at_s": captured_at,
            "stderr_tail": text.splitlines()[-15:],
        }
    )
    log(f"{name}: snakemake exit {rc} in {record['steps'][-1]['seconds']} s")
    capture(out / "captures/after")
    found = leftovers()
    record["leftovers"] = found
    if any(found.values()):
        record["forced_cleanup"] = [
            {k: r[k] for k in ("argv", "exit", "stderr")} for r in force_clean(found)
        ]
    # Big, regenerable outputs stay in the guest; raw data, tables, figures and paper come back.
    shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    record["problems"] = [
        *([f"snakemake exited {rc}"] if rc != 0 else []),
        *([f"left behind: {found}"] if any(found.values()) else []),
    ]
    record["ok"] = not record["problems"]
    write_json(out / "case.json", record)
    return record


def patch_papermill_timeout(workdir: Path, spec: dict) -> list[str]:
    """Under TCG a Jupyter kernel takes longer than papermill's default 60 s to start; the case
    may raise that limit in this copy of the workflow (recorded in case.json)."""
    seconds = spec.get("papermill_start_timeout_s")
    rules = workdir / "workflow/rules/analysis.smk"
    if not seconds or not rules.exists():
        return []
    text = rules.read_text()
    if "--start-timeout" in text or "--kernel python3" not in text:
        return []
    option = f"--kernel python3 --start-timeout {int(seconds)}"
    rules.write_text(text.replace("--kernel python3", option))
    return [f"{rules.relative_to(workdir)}: papermill {option}"]


def run_commands_case(name: str, case: dict, disks: list[dict], job: dict) -> dict:
    """A debugging aid: run the case's ``commands`` (argv lists; the workflow venv's bin first on
    PATH) and keep their output, plus the kernel log."""
    out = RESULTS / name
    out.mkdir(parents=True, exist_ok=True)
    venv = job.get("venv")
    env_path = f"{venv}/bin:{ENV['PATH']}" if venv else ENV["PATH"]
    steps = []
    for i, argv in enumerate(case["commands"]):
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=float(case.get("timeout_s", 600)),
                check=False,
                env={**ENV, "PATH": env_path},
            )
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            rc, text = None, f"{type(exc).__name__}: {exc}"
        (out / f"command-{i}.txt").write_text(f"$ {' '.join(argv)}\n{text}\n# exit {rc}\n")
        steps.append(
            {
                "step": f"command-{i}",
                "argv": argv,
                "exit": rc,
                "seconds": round(time.monotonic() - t0, 2),
            }
        )
        log(f"{name}: {' '.join(argv)[:120]} -> exit {rc}")
    (out / "dmesg.txt").write_text(sh(["dmesg"])["stdout"])
    record = {"case": name, "steps": steps}
    record["problems"] = [f"{s['step']} exited {s['exit']}" for s in steps if s["exit"] != 0]
    record["ok"] = not record["problems"]
    write_json(out / "case.json", record)
    return record


def sh_each(argvs: list[list[str]]) -> list[dict]:
    return [sh(argv) for argv in argvs]


def problems(case: dict, record: dict) -> list[str]:
    """The driver's own verdict (the host test asserts in detail on the files)."""
    found = []
    steps = {s["step"]: s for s in record["steps"]}
    expect = case.get("expect", {}).get("stack_up", "ok")
    up = steps.get("stack-up")
    if expect == "ok":
        for s in record["steps"]:
            if s["exit"] != 0:
                found.append(
                    f"{s['step']} exited {s['exit']}: {' | '.join(s.get('stderr_tail', [])[-3:])}"
                )
    elif up is not None:
        pattern = expect["refused"]
        text = "\n".join(up.get("stderr_tail", []))
        if up["exit"] == 0:
            found.append("stack-up was expected to refuse, but succeeded")
        elif not re.search(pattern, text):
            found.append(f"stack-up refused, but not with /{pattern}/: {text[-300:]}")
        setup_made = set(case.get("expect", {}).get("setup_changes_disks", []))
        for serial, before in record["fingerprints_before"].items():
            if serial not in setup_made and record["fingerprints_after"][serial] != before:
                found.append(f"refused stack-up changed disk {serial}")
    if any(record["leftovers"].values()):
        found.append(f"left behind: {record['leftovers']}")
    if record["state_file_left"]:
        found.append("the state file is still there after stack-down")
    return found


# --- main ----------------------------------------------------------------------------------------


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    job = json.loads((IO / "job.json").read_text())
    summary: dict = {
        "ok": False,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "modules": {},
        "disks": [],
        "cases": {},
    }
    write_json(RESULTS / "summary.json", summary)
    for module in job.get("modules", MODULES):
        r = sh(["modprobe", module])
        summary["modules"][module] = (
            r["exit"] if r["exit"] == 0 else f"{r['exit']}: {r['stderr'].strip()}"
        )
    summary["loopback"] = loopback_up()
    log(f"kernel {summary['kernel']}, modules {summary['modules']}, lo {summary['loopback']}")
    summary["disks"] = scratch_disks()
    log(f"scratch disks {summary['disks']}")
    tools = {}
    names = ("cryptsetup", "dmsetup", "mdadm", "fio", "losetup", "mkfs.ext4", "mkfs.xfs")
    for tool in (*names, *(["ceph-osd"] if shutil.which("ceph-osd") else [])):
        r = sh([tool, "--version"] if tool != "mkfs.xfs" else [tool, "-V"])
        tools[tool] = (r["stdout"] or r["stderr"]).strip().splitlines()[:1]
    summary["tools"] = tools
    capture(RESULTS / "captures-boot")
    write_json(RESULTS / "summary.json", summary)
    for plan_file in job["plans"]:
        name = Path(plan_file).stem
        log(f"=== case {name}")
        t0 = time.monotonic()
        try:
            case = json.loads((IO / "plans" / plan_file).read_text())
            run = (
                run_snakemake_case
                if "snakemake" in case
                else run_commands_case
                if "commands" in case
                else run_case
            )
            record = run(name, case, summary["disks"], job)
        except Exception:
            record = {"case": name, "ok": False, "problems": [traceback.format_exc()]}
            log(f"{name}: driver error\n{traceback.format_exc()}")
        summary["cases"][name] = {
            "ok": record["ok"],
            "problems": record["problems"],
            "seconds": round(time.monotonic() - t0, 1),
        }
        log(f"=== case {name}: {'ok' if record['ok'] else 'PROBLEMS ' + str(record['problems'])}")
        write_json(RESULTS / "summary.json", summary)
    summary["ok"] = all(c["ok"] for c in summary["cases"].values())
    summary["driver_seconds"] = round(time.monotonic() - T0, 1)
    write_json(RESULTS / "summary.json", summary)
    log(f"done in {summary['driver_seconds']} s: {'ok' if summary['ok'] else 'PROBLEMS'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        with contextlib.suppress(OSError):
            (RESULTS / "driver-crash.txt").write_text(traceback.format_exc())
        sys.exit(2)
