from . import mask_predict_loss  # noqa: F401
