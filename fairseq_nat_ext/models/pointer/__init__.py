"""Pointer networks: ``pointer_lstm`` (Vinyals et al. 2015) and ``pointer_transformer``."""
from . import pointer_lstm  # noqa: F401
from . import pointer_transformer  # noqa: F401
