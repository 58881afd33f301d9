"""The crypto ceiling: a LUKS stack cannot move data faster than its cipher runs on all CPUs.

Per host and LUKS stack: ``cryptsetup benchmark``'s throughput of the stack's cipher x logical
CPUs (decryption for reads, encryption for writes), or the sentence saying why there is none.
Where the kernel's ciphers could not be benchmarked (no AF_ALG), the cryptsetup table's
``openssl speed`` rows of the same cipher give it, labelled a userspace estimate wherever shown.
"""

from __future__ import annotations

import pandas as pd

from luksbench.publish.run import unavailable_stacks
from luksbench.publish.text import fmt_num, missing


def cipher_key(cipher: str | None) -> str | None:
    """LUKS cipher spec -> ``cryptsetup benchmark`` algorithm: aes-xts-plain64 -> aes-xts."""
    if missing(cipher) or not cipher:
        return None
    parts = str(cipher).lower().split("-")
    return "-".join(parts[:2]) if len(parts) >= 2 else parts[0]


KERNEL_SOURCE = "cryptsetup benchmark"


def source_of(row) -> str:
    """Which tool measured a cipher row (tables written before ``source`` existed: cryptsetup)."""
    source = row.get("source") if hasattr(row, "get") else None
    return KERNEL_SOURCE if missing(source) or not source else str(source)


def is_estimate(row) -> bool:
    """A userspace estimate, not the kernel cipher's own benchmark."""
    return source_of(row) != KERNEL_SOURCE


def cipher_label(row) -> str:
    """``aes-xts 512b``, with ``(userspace estimate (openssl))`` where it is one."""
    label = f"{row['algorithm']} {fmt_num(row['key_bits'], 0)}b"
    return f"{label} ({source_of(row)})" if is_estimate(row) else label


def estimate_mark(row) -> str:
    """`` (userspace estimate (openssl))`` after a cipher row's name where it is one."""
    return f" ({source_of(row)})" if is_estimate(row) else ""


def available_ciphers(cryptsetup: pd.DataFrame) -> pd.DataFrame:
    """The cipher rows of ``cryptsetup benchmark`` that have a result."""
    cipher = cryptsetup["kind"] == "cipher"
    return cryptsetup[cipher & cryptsetup["available"].fillna(False).astype(bool)]


def _cpus(env: pd.DataFrame, host: str) -> int | None:
    counts = env.loc[env["host"] == host, "cpu_count"]
    return int(counts.iloc[0]) if len(counts) and pd.notna(counts.iloc[0]) else None


def _no_benchmark_row(ciphers: pd.DataFrame, available: pd.DataFrame, rec: dict) -> str:
    """Why the benchmark has no usable row for the stack's cipher."""
    failed = ciphers[~ciphers["available"].fillna(True).astype(bool)]
    notes = sorted({str(n) for n in failed["note"].dropna() if str(n).strip()})
    if available.empty and notes:
        return f"the cipher benchmark did not run on {rec['host']}: " + "; ".join(notes).strip()
    return (
        f"`cryptsetup benchmark` on {rec['host']} has no row for {rec['algorithm']} "
        f"{rec['key_bits'] or '?'}-bit"
    )


def _ceiling(rec: dict, cryptsetup: pd.DataFrame) -> dict:
    """``rec`` (host, stack, algorithm, key_bits, cpus) with the ceiling or the reason filled in."""
    host = rec["host"]
    cs = cryptsetup[cryptsetup["host"] == host] if len(cryptsetup) else cryptsetup
    if cs is None or cs.empty:
        return rec | {"reason": f"no `cryptsetup benchmark` output was recorded on {host}"}
    ciphers, available = cs[cs["kind"] == "cipher"], available_ciphers(cs)
    match = available[
        (available["algorithm"].str.lower() == (rec["algorithm"] or ""))
        & (available["key_bits"].astype(float) == float(rec["key_bits"] or -1))
    ]
    if match.empty:
        return rec | {"reason": _no_benchmark_row(ciphers, available, rec)}
    if "source" in match:  # the kernel's own benchmark before a userspace estimate
        match = match.assign(_est=[is_estimate(r) for _, r in match.iterrows()]).sort_values(
            "_est", kind="stable"
        )
    if rec["cpus"] is None:
        return rec | {"reason": f"env.json of {host} does not give the number of CPUs"}
    best = match.iloc[0]
    enc, dec = float(best["encryption_mib_s"]), float(best["decryption_mib_s"])
    block = best.get("block_bytes")
    return rec | {
        "source": source_of(best),
        "block_bytes": None if missing(block) else int(block),
        "enc_mib_s": enc,
        "dec_mib_s": dec,
        "read_ceiling_mib_s": dec * rec["cpus"],
        "write_ceiling_mib_s": enc * rec["cpus"],
    }


def crypto_ceilings(
    cryptsetup: pd.DataFrame, stacks: pd.DataFrame, env: pd.DataFrame
) -> list[dict]:
    """Per host and LUKS stack that was built: the cipher's benchmark throughput per core x
    logical CPUs (decryption for reads, encryption for writes), or the ``reason`` there is none."""
    luks = stacks[stacks["kind"] == "luks"] if len(stacks) else stacks
    gone = {(u["host"], u["stack"]) for u in unavailable_stacks(stacks)}
    out = []
    for _, st in luks.iterrows():
        host, name = str(st["host"]), str(st["stack"])
        if (host, name) in gone:
            continue
        rec = {
            "host": host,
            "stack": name,
            "algorithm": cipher_key(st["cipher"]),
            "key_bits": None if pd.isna(st["key_bits"]) else int(st["key_bits"]),
            "cpus": _cpus(env, host),
            **dict.fromkeys(
                ("enc_mib_s", "dec_mib_s", "read_ceiling_mib_s", "write_ceiling_mib_s")
            ),
            "source": None,
            "block_bytes": None,
            "reason": None,
        }
        out.append(_ceiling(rec, cryptsetup))
    return out


def undescribed(ceilings: list[dict], hosts, stacks, baseline: str) -> list[dict]:
    """Hosts the stacks table does not describe (no stacks table; the fio servers of a fleet run,
    whose stacks the coordinator built): one ceiling per stack but the baseline saying so, so a
    figure still says there is no ceiling."""
    described = {c["host"] for c in ceilings}
    return [
        {"host": h, "stack": s, "reason": "the stacks table does not describe this stack"}
        for h in hosts
        if h not in described
        for s in stacks
        if s != baseline
    ]


def ceiling_text(c: dict) -> str:
    """One ceiling as the paper states it, or the reason there is none."""
    if c["reason"]:
        return c["reason"].rstrip(".")
    return (
        f"{c['algorithm']} {c['key_bits']}-bit: {fmt_num(c['dec_mib_s'])} MiB/s "
        f"decryption, {fmt_num(c['enc_mib_s'])} MiB/s encryption per core \u00d7 "
        f"{c['cpus']} CPUs = {fmt_num(c['read_ceiling_mib_s'], 0)} MiB/s read ceiling, "
        f"{fmt_num(c['write_ceiling_mib_s'], 0)} MiB/s write ceiling{estimate_note(c)}"
    )


def estimate_note(c: dict) -> str:
    """For a ceiling from a userspace estimate: what it is and is not; else nothing."""
    if not c.get("source") or c["source"] == KERNEL_SOURCE:
        return ""
    block = f" on {c['block_bytes']}-byte buffers" if c.get("block_bytes") else ""
    return (
        f" ({c['source']}: `openssl speed -evp` of the same cipher{block}, since "
        "`cryptsetup benchmark` could not run the kernel's (no AF_ALG, or no such row); "
        "this is OpenSSL's speed on this CPU, not dm-crypt's)"
    )
