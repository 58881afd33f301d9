# Convenience targets; the real entry points are scripts/setup.sh, snakemake and pytest (README).
# The vm* targets boot a Debian guest under qemu (TCG) to run the kernel backend (dm-crypt, MD)
# for real: they need root, mmdebstrap and qemu-system-x86 (scripts/setup.sh installs them).
PYTHON ?= .venv/bin/python
VMBOX := $(PYTHON) tests/vm/harness.py
VMOUT ?= build/vmbox

.PHONY: test test-fast test-integration vmimage vmimage-workflow vmtest vmtest-full vmrun \
	vmsnakemake vmsnakemake-keep

# Everything, as README and CI run it: unit, integration, the VM test box and the notebooks.
test:
	$(PYTHON) -m pytest

# The development tier (tests/README.md): tests/unit without its few simulations marked slow.
test-fast:
	$(PYTHON) -m pytest tests/unit -m "not slow"

# fio, loop devices, FUSE, snakemake runs, chromium and the notebooks (nbval).
test-integration:
	$(PYTHON) -m pytest tests/integration notebooks

# Build the guest image, or reuse the cached one (LUKSBENCH_VMBOX_CACHE, default
# /var/cache/luksbench-vmbox); prints its directory.
vmimage:
	$(VMBOX) image

# The same plus a venv with the workflow's Python stack (for vmsnakemake).
vmimage-workflow:
	$(VMBOX) image --variant workflow

# The VM tests (every case in tests/vm/plans/), as CI runs them.
vmtest:
	$(PYTHON) -m pytest -m "vm and not vm_full" tests/vm

# Every study (config/studies/) in the guest as well: ~20 min more under TCG.
vmtest-full:
	$(PYTHON) -m pytest -m "vm or vm_full" tests/vm

# Boot once for every case in tests/vm/plans/ and keep the results in $(VMOUT) to look at.
vmrun:
	$(VMBOX) run --out $(VMOUT)

# snakemake --cores 1 all inside the guest (kernel backend, small matrix, then the analysis and
# the paper), checked by its test; about 15 minutes under TCG, so not part of the default suite.
vmsnakemake:
	LUKSBENCH_VMBOX_WORKFLOW=1 $(PYTHON) -m pytest -m vm tests/vm/test_vmbox.py -k snakemake

# The same, keeping everything in $(VMOUT)-snakemake/results/snakemake-small/workflow/.
vmsnakemake-keep:
	$(VMBOX) run --out $(VMOUT)-snakemake --timeout 3600 \
	  --plan tests/vm/workflow-plans/snakemake-small.json
