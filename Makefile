# Convenience targets; the real entry points are scripts/setup.sh, snakemake and pytest (README).
# The vm* targets boot a Debian guest under qemu (TCG) to run the kernel backend (dm-crypt, MD)
# for real: they need root, mmdebstrap and qemu-system-x86 (scripts/setup.sh installs them).
PYTHON ?= .venv/bin/python
VMBOX := $(PYTHON) tests/vmbox/harness.py
VMOUT ?= build/vmbox

.PHONY: vmimage vmimage-workflow vmtest vmtest-full vmrun vmsnakemake vmsnakemake-keep

# Build the guest image, or reuse the cached one (LUKSBENCH_VMBOX_CACHE, default
# /var/cache/luksbench-vmbox); prints its directory.
vmimage:
	$(VMBOX) image

# The same plus a venv with the workflow's Python stack (for vmsnakemake).
vmimage-workflow:
	$(VMBOX) image --variant workflow

# The VM tests (every case in tests/vmbox/plans/), as CI runs them.
vmtest:
	$(PYTHON) -m pytest -m vm tests/test_vmbox.py

# Every study (config/studies/) in the guest as well: ~20 min more under TCG.
vmtest-full:
	$(PYTHON) -m pytest -m "vm or vm_full" tests/test_vmbox.py tests/test_profiles.py

# Boot once for every case in tests/vmbox/plans/ and keep the results in $(VMOUT) to look at.
vmrun:
	$(VMBOX) run --out $(VMOUT)

# snakemake --cores 1 all inside the guest (kernel backend, small matrix, then the analysis and
# the paper), checked by its test; about 15 minutes under TCG, so not part of the default suite.
vmsnakemake:
	LUKSBENCH_VMBOX_WORKFLOW=1 $(PYTHON) -m pytest -m vm tests/test_vmbox.py -k snakemake

# The same, keeping everything in $(VMOUT)-snakemake/results/snakemake-small/workflow/.
vmsnakemake-keep:
	$(VMBOX) run --out $(VMOUT)-snakemake --timeout 3600 \
	  --plan tests/vmbox/workflow-plans/snakemake-small.json
