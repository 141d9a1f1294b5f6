from . import nat  # noqa: F401
from . import efficient_transformer  # noqa: F401
