from setuptools import find_packages, setup

setup(
    name="fairseq_nat_ext",
    version="0.1.0",
    description="fairseq plugin: efficient attention, non-autoregressive generation, pointer networks",
    packages=find_packages(include=["fairseq_nat_ext", "fairseq_nat_ext.*"]),
    python_requires=">=3.9",
    # runtime dependencies are installed by `make venv` (fairseq-fixed needs --no-build-isolation)
    install_requires=[],
)
