from . import nat_translation  # noqa: F401
