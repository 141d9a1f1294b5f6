from . import nat  # noqa: F401
