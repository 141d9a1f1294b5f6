"""fairseq_nat_ext: a fairseq plugin (``--user-dir fairseq_nat_ext``).

Importing the package first checks that a usable fairseq 0.12.x is installed (else one-line ImportError
naming the builds that work), applies the compat shims, then imports every subpackage so that fairseq's
decorators register the tasks, models (archs) and criterions.  Importing it twice (e.g. a hub import
followed by ``--user-dir``, or in-process tests) registers nothing twice.
"""
import logging
import os

# fairseq's text_to_speech task logs "Please install tensorboardX" at import time, through a root
# handler it installs; keep that line out of our command-line tools' output.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
# fairseq.models.wav2vec.wav2vec2_classification calls logging.basicConfig(level=logging.DEBUG) when it is
# imported, so a program that imports fairseq before configuring logging (our `python -m` tools) would print
# every library's debug lines (matplotlib's font search, ...). Remember the root level to undo exactly that.
_ROOT_LEVEL_BEFORE_FAIRSEQ = logging.getLogger().level

from .version import __version__  # noqa: E402,F401

#: fairseq builds the plugin works with (one line, also the start of the ImportError below)
FAIRSEQ_BUILDS = ("fairseq_nat_ext needs fairseq 0.12.x: pip install fairseq-fixed==0.12.3.1 "
                  "--no-build-isolation on Python >= 3.10, or fairseq==0.12.2 on Python <= 3.9")
_MIN_FAIRSEQ = (0, 12)


def _fairseq_version_tuple(text):
    import re

    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _check_fairseq():
    """ImportError (one line: which builds work, what was found) unless a usable fairseq >= 0.12 imports."""
    import sys

    try:
        import fairseq
        from fairseq.models import register_model_architecture  # noqa: F401  (the plugin's entry point)
    except Exception as err:  # missing, or a build that breaks on this Python (fairseq 0.12.2 on 3.11)
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        found = (f"found {type(err).__name__}: {detail}" if detail else f"found {type(err).__name__}")
        raise ImportError(f"{FAIRSEQ_BUILDS}; {found} (Python {sys.version.split()[0]})") from err
    version = getattr(fairseq, "__version__", "unknown")
    parsed = _fairseq_version_tuple(version)
    if parsed is None or parsed < _MIN_FAIRSEQ:
        raise ImportError(f"{FAIRSEQ_BUILDS}; found fairseq {version} at {os.path.dirname(fairseq.__file__)}")


_check_fairseq()

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

