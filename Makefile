# fairseq_nat_ext: two-command set-up.  `make quickstart` and `make test` both create .venv when missing.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
VPIP := $(VPY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv quickstart test test-fast clean-venv

$(STAMP): setup.py
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPIP) install -q --upgrade "pip<26" "setuptools<81" wheel
	# torch pinned: any looser spec pulls a multi-GB CUDA build
	$(VPIP) install -q torch==2.13.0 cython "numpy<2.5" 
	# fairseq-fixed = fairseq main + Python 3.11 fixes; compiled against the torch above
	$(VPY) -c "import fairseq" 2>/dev/null || $(VPIP) install -q --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
	$(VPIP) install -q hydra-core==1.3.2 omegaconf==2.3.0 bitarray regex sacrebleu==2.4.3 scikit-learn tqdm cffi packaging \
		sacremoses==0.1.1 pytest hypothesis matplotlib scipy elkai==2.0.1 py3langid==0.4.0
	# word aligner of examples/fertility.sh (fertility NAT supervision)
	$(VPIP) install -q eflomal==2.0.0
	$(VPY) -c "import fastBPE" 2>/dev/null || $(VPIP) install -q --no-build-isolation fastbpe==0.1.0
	$(VPIP) install -q --no-build-isolation --no-deps -e .
	# fastBPE's `fast` CLI (learns codes), compiled from the same source package
	VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash examples/tools/build_fastbpe.sh
	touch $(STAMP)

venv: $(STAMP)

quickstart: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash examples/quickstart.sh

test: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH OMP_NUM_THREADS=2 $(VPY) -m pytest -q tests

test-fast: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VPY) -m pytest -q -m "not slow" tests

clean-venv:
	rm -rf $(VENV)
