from . import nat_translation  # noqa: F401
from . import listops  # noqa: F401
from . import kermit  # noqa: F401
from . import pointer_geometry  # noqa: F401
