"""A raw run built from REAL fio output (TUM-DSE/CVM_eval plain vs dm-crypt runs in the shared
external datasets; copied, never edited), and the shipped sample's layout.

* host ``tum-direct2``, cell ``randread-4k-qd32``: pair 1 = native VM (no-dmcrypt vs dm-crypt),
  pair 2 = SEV VM (no-dmcrypt vs dm-crypt); fio 3.36, 10 stonewalled jobs per file.
* host ``tum-vm``, same cell: one pair of virtio-blk runs (plain vs "encr"), fio 3.30, 4 jobs x
  numjobs=4 without group_reporting, job names differ between the stacks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from testkit.paths import SAMPLE

SAMPLE_HOST = next(p.name for p in SAMPLE.iterdir() if p.is_dir())


def sample_rep(raw_dir: Path, stack: str, workload: str, k: int) -> Path:
    """Repetition ``k``'s fio file of a copy of the shipped sample at ``raw_dir``."""
    return raw_dir / SAMPLE_HOST / "fio" / stack / workload / f"rep{k}.json"


TUM = "TUM-DSE__CVM_eval"
DIRECT2 = f"{TUM}/logs/sev/direct-2"
PAIRS = {
    ("tum-direct2", 1): (
        f"{DIRECT2}/native-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-quick-direct-fio-2024-02-13-12-42-24.log",
        f"{DIRECT2}/native-aio-io_uring-8-nvme1n1-iou-quick-direct-fio-2024-02-13-12-23-39.log",
    ),
    ("tum-direct2", 2): (
        f"{DIRECT2}/sev-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-quick-direct-fio-2024-02-13-12-51-40.log",
        f"{DIRECT2}/sev-aio-io_uring-8-nvme1n1-iou-quick-direct-fio-2024-02-13-12-33-10.log",
    ),
    ("tum-vm", 1): (
        f"{TUM}/tools/archive/bm-results-archive/native-vm/virtio-blk/iops/fio-result-iops-nosev-blk-q5h680yt5w.json",
        f"{TUM}/tools/archive/bm-results-archive/native-vm/encr/virtio-blk/iops/fio-result-iops-nosev-encr-blk-bvuo3oghsu.json",
    ),
}
WORKLOAD = "randread-4k-qd32"
CS_A = "SovereignCloudStack__website/cryptsetup_benchmark_scs_blog_testsystemA_2xXeonGold6151.txt"
CS_NO_ALG = "HelloVolla__ubuntu-touch-beta-tests/issue-114_cryptsetup_benchmark_algif_missing.txt"


def build_raw(external_dir: Path, raw_dir: Path) -> Path:
    """Copy the real files into the raw layout; env/stacks/cpu sidecars are small hand-written
    descriptions (metadata, not measurements)."""
    for (host, rep), (plain, luks) in PAIRS.items():
        for stack, src in (("plain", plain), ("luks", luks)):
            dst = raw_dir / host / "fio" / stack / WORKLOAD / f"rep{rep}.json"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(external_dir / src, dst)
    # one CPU sidecar per file of the first host (the other host has none: NaN columns)
    for stack in ("plain", "luks"):
        for rep in (1, 2):
            sidecar = raw_dir / "tum-direct2" / "fio" / stack / WORKLOAD / f"rep{rep}.cpu.json"
            sidecar.write_text(
                json.dumps(
                    {
                        "interval_s": 300.0,
                        "clk_tck": 100,
                        "cpu_count": 8,
                        "delta_s": {
                            "user": 100.0,
                            "nice": 0.0,
                            "system": 200.0 + 10 * rep,
                            "idle": 2000.0,
                            "iowait": 10.0,
                            "irq": 0.0,
                            "softirq": 5.0,
                            "steal": 0.0,
                        },
                        "busy_s": 305.0 + 10 * rep,
                        "busy_pct": 12.5,
                    }
                )
            )
    env = {
        "tum-direct2": {
            "hostname": "tum-native",
            "kernel": {"release": "6.6.0"},
            "cpu": {
                "model": "AMD EPYC 7713P 64-Core Processor",
                "count": 8,
                "aes": True,
                "vaes": True,
            },
            "tools": {"fio": "fio-3.36", "cryptsetup": "cryptsetup 2.6.1"},
            "backend": {
                "requested": "kernel",
                "selected": "kernel",
                "reason": "dm-crypt available",
            },
        },
        "tum-vm": {
            "hostname": "tum-vm",
            "backend": {"selected": "kernel"},
            "cpu": {"aes": True, "vaes": False, "flags": ["fpu", "sse2", "aes", "avx2"]},
        },
    }
    for host, doc in env.items():
        (raw_dir / host / "env.json").write_text(json.dumps(doc))
        # The runner records the stack descriptions in the run's manifest.
        (raw_dir / host / "fio" / "manifest.json").write_text(
            json.dumps(
                {
                    "stack_descriptions": {
                        "stacks": {
                            "plain": {"kind": "plain", "backend": "kernel"},
                            "luks": {
                                "kind": "luks",
                                "backend": "kernel",
                                "cipher": "aes-xts-plain64",
                                "key_bits": 512,
                            },
                        }
                    }
                }
            )
        )
    shutil.copyfile(external_dir / CS_A, raw_dir / "tum-direct2" / "cryptsetup-benchmark.txt")
    shutil.copyfile(external_dir / CS_NO_ALG, raw_dir / "tum-vm" / "cryptsetup-benchmark.txt")
    return raw_dir
