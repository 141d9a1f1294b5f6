from . import mask_predict_loss  # noqa: F401
from . import classification_cross_entropy  # noqa: F401
from . import levenshtein_loss  # noqa: F401
from . import insertion_loss  # noqa: F401
from . import kermit_loss  # noqa: F401
from . import ctc_loss  # noqa: F401
from . import imputer_loss  # noqa: F401
from . import pointer_cross_entropy  # noqa: F401
