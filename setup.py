"""fairseq_nat_ext: install with `make venv` (pinned, CPU) or into an existing fairseq environment:

    pip install fairseq-fixed==0.12.3.1 --no-build-isolation   # Python >= 3.10 (or fairseq==0.12.2 on <= 3.9)
    pip install -e .            # or: pip install -e ".[aligner,pointer,bpe,test]"

fairseq itself is not a requirement: fairseq (0.12.2, Python <= 3.9) and fairseq-fixed (0.12.3.1,
Python >= 3.10) are two distributions of the same package and cannot both be required; the plugin
checks at import time that one of them is there (fairseq_nat_ext/__init__.py).
"""
import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


VERSION = re.search(r'^__version__ = "([^"]+)"', _read("fairseq_nat_ext/version.py"), re.M).group(1)

setup(
    name="fairseq_nat_ext",
    version=VERSION,
    description="fairseq plugin: non-autoregressive generation, efficient attention, pointer networks",
    long_description=_read("README.md"),
    long_description_content_type="text/markdown",
    license="MIT",
    packages=find_packages(include=["fairseq_nat_ext", "fairseq_nat_ext.*"]),
    python_requires=">=3.9",
    # fairseq's own runtime dependencies are listed too: fairseq-fixed is installed with --no-deps
    install_requires=[
        "torch>=2.1",
        "numpy",
        "sacrebleu>=2.0",
        "sacremoses",
        "omegaconf",
        "hydra-core",
        "regex",
        "tqdm",
        "bitarray",  # fairseq imports it (data/huffman) at start-up
        "scikit-learn",  # fairseq imports it (criterions/sentence_prediction) at start-up
        "packaging",
        "cffi",
    ],
    extras_require={
        "aligner": ["eflomal"],  # examples/fertility.sh aligner (fertility NAT supervision)
        "pointer": ["elkai", "scipy"],  # pointer_geometry labels (TSP tours, hulls, Delaunay)
        "bpe": ["fastbpe"],  # examples/prepare_data.sh, from_pretrained(..., bpe="fastbpe")
        "benchmarks": [  # benchmarks/ (not installed): plots and the attention speed study's peers
            "matplotlib",
            "local-attention",
            "linformer",
            "performer-pytorch",
            "reformer-pytorch",
            "sinkhorn-transformer",
            "routing-transformer",
        ],
        "test": ["pytest", "hypothesis"],
    },
    entry_points={
        "console_scripts": [
            "fairseq-nat-translate = fairseq_nat_ext.evaluation.translate:cli_main",
            "fairseq-nat-ext = fairseq_nat_ext.__main__:main",
        ],
    },
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
