from . import mask_predict  # noqa: F401
