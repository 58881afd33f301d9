#!/usr/bin/env bash
# Set up luksbench on a fresh Debian/Ubuntu machine: system tools (apt, when root and missing)
# and a virtualenv in .venv with the pinned Python dependencies. Safe to run again.
# The run and the test suite need the same: the tests measure for real, too.
set -euo pipefail

cd "$(dirname "$0")/.."
venv=.venv
requirements=envs/requirements.txt

# tool -> Debian package that provides it
declare -A debian_package=(
  [fio]=fio
  [cryptsetup]=cryptsetup-bin
  [qemu-storage-daemon]=qemu-system-common
  [fusermount3]=fuse3
  [mkfs.xfs]=xfsprogs  # fs layers (xfs); ext4's e2fsprogs is in every Debian base system
  [chromium]=chromium  # the test suite opens the generated HTML paper in headless chromium
  [pandoc]=pandoc  # the optional PDF of the paper (snakemake --cores 1 pdf) and its test
  [weasyprint]=weasyprint  # pandoc's PDF engine here (HTML + CSS; no LaTeX needed)
  # tests/vm/test_vmbox.py builds a Debian guest and boots it to run dm-crypt and MD for real
  [mmdebstrap]=mmdebstrap
  [qemu-system-x86_64]=qemu-system-x86
  # Ceph arms: a throwaway monitor and BlueStore OSDs per run (testbox/ceph.py); no daemon starts on install
  [ceph-mon]=ceph-mon
  [ceph-osd]=ceph-osd
  [ceph]=ceph-common  # also brings rbd, ceph-authtool, monmaptool
)
missing_packages=()
for tool in "${!debian_package[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 \
    || missing_packages+=("${debian_package[$tool]}")
done
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing_packages+=(python3-venv)

if [ ${#missing_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing_packages[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null
  else
    echo "setup: missing system packages: ${missing_packages[*]}" >&2
    echo "  Debian/Ubuntu: sudo apt-get install ${missing_packages[*]}" >&2
    echo "  Fedora:        sudo dnf install fio cryptsetup qemu-storage-daemon fuse3 python3 ceph-mon ceph-osd ceph-common" >&2
    exit 1
  fi
fi

# A checkout moved or copied with its .venv: the venv's scripts and its editable install still point
# at the old place (it would run the old source). Rebuild it when luksbench does not import from here.
here=$(pwd -P)
venv_source() {
  (cd / && env -u PYTHONPATH "$here/$venv/bin/python" -c \
    'import luksbench, pathlib; print(pathlib.Path(luksbench.__file__).resolve().parents[2])' \
    2>/dev/null) || echo "nowhere (luksbench does not import)"
}
if [ -f "$venv/pyvenv.cfg" ] && [ -x "$venv/bin/python" ] && [ "$(venv_source)" != "$here" ]; then
  echo "setup: $venv runs luksbench from $(venv_source), not from this checkout ($here): rebuilding it" >&2
  rm -rf "$venv"
fi

# Reinstall the virtualenv only when the pins changed.
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$requirements" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating $venv with the pinned dependencies ($requirements)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" >"$stamp"
fi
# rfc3987-syntax (pulled in by jupyter-events through jsonschema[format-nongpl]) compiles 39 Lark
# grammars whenever jsonschema is imported: 1.5 s of CPU in every snakemake and `luksbench plan`
# process, minutes over the test suite. No schema here uses the IRI formats it checks; without it
# jsonschema leaves only those formats unchecked.
if "$venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("rfc3987_syntax") is None)'; then
  "$venv/bin/python" -m pip uninstall -y -q --disable-pip-version-check rfc3987-syntax
fi
if [ "$(venv_source)" != "$here" ]; then
  echo "setup: $venv imports luksbench from $(venv_source), not from $here" >&2
  exit 1
fi
echo "setup: ready ($("$venv/bin/python" --version), $(fio --version), $(PATH="$PATH:/usr/sbin" cryptsetup --version))" >&2
