from . import mask_predict  # noqa: F401
from . import levenshtein  # noqa: F401
from . import insertion  # noqa: F401
from . import kermit  # noqa: F401
from . import ctc_nat  # noqa: F401
from . import imputer  # noqa: F401
from . import nat_fertility  # noqa: F401
from . import iterative_refinement  # noqa: F401
