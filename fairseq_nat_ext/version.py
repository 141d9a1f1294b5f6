"""The package version, in one place: read by ``setup.py`` (as text, without importing the package)
and exported as ``fairseq_nat_ext.__version__``."""
__version__ = "0.3.0.dev0"
