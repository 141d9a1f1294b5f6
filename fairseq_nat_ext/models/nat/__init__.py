from . import mask_predict  # noqa: F401
from . import levenshtein  # noqa: F401
from . import insertion  # noqa: F401
from . import kermit  # noqa: F401
from . import ctc_nat  # noqa: F401
from . import imputer  # noqa: F401
