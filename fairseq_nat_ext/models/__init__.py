from . import nat  # noqa: F401
from . import efficient_transformer  # noqa: F401
from . import efficient_classifier  # noqa: F401
from . import pointer  # noqa: F401
