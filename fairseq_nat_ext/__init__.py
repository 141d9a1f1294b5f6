"""fairseq_nat_ext: a fairseq plugin (``--user-dir fairseq_nat_ext``).

Importing the package applies the compat shims first, then imports every subpackage so that fairseq's
decorators register the tasks, models (archs) and criterions.  Importing it twice (e.g. a hub import
followed by ``--user-dir``, or in-process tests) registers nothing twice.
"""
import logging

# fairseq's text_to_speech task logs "Please install tensorboardX" at import time, through a root
# handler it installs; keep that line out of our command-line tools' output.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
# fairseq.models.wav2vec.wav2vec2_classification calls logging.basicConfig(level=logging.DEBUG) when it is
# imported, so a program that imports fairseq before configuring logging (our `python -m` tools) would print
# every library's debug lines (matplotlib's font search, ...). Remember the root level to undo exactly that.
_ROOT_LEVEL_BEFORE_FAIRSEQ = logging.getLogger().level

from . import compat  # noqa: E402

compat.apply()

_REGISTRATION_KEY = "_fairseq_nat_ext_registered"


def _register_once():
    import fairseq

    if getattr(fairseq, _REGISTRATION_KEY, None):
        return  # already registered by an earlier import (maybe under another module name)
    setattr(fairseq, _REGISTRATION_KEY, __name__)
    from . import criterions, generators, models, tasks  # noqa: F401  (registration)


_register_once()
if logging.getLogger().level == logging.DEBUG != _ROOT_LEVEL_BEFORE_FAIRSEQ:
    logging.getLogger().setLevel(_ROOT_LEVEL_BEFORE_FAIRSEQ)

__version__ = "0.1.0"
