"""What every length-then-tokens NAT generator of the plugin sets up the same way."""
from ..modules.module_walk import any_training


def eval_mode(models):
    """Put ``models`` in eval mode, as a generator must before decoding; models already wholly in eval
    mode are left alone (fairseq-generate's and the harness's are: ``model.eval()`` walks and sets every
    submodule again, about 0.25 ms per call for Mask-Predict's 111 modules, once per batch-1 sentence;
    the check walks them without setting anything, :func:`.module_walk.any_training`)."""
    for m in models:
        if any_training(m):
            m.eval()


class NATGeneratorBase:
    """Special symbols, the length cap and fairseq-generate's strip set for ``models`` (an ensemble
    sharing ``tgt_dict``; the first model's ``mask_idx`` is the mask symbol)."""

    def __init__(self, models, tgt_dict, retain_history=False):
        self.models = models
        self.tgt_dict = tgt_dict
        self.retain_history = retain_history
        self.pad, self.eos, self.bos, self.unk = tgt_dict.pad(), tgt_dict.eos(), tgt_dict.bos(), tgt_dict.unk()
        self.mask = models[0].mask_idx
        #: never emitted inside a hypothesis
        self.forbidden = [self.pad, self.bos, self.eos, self.mask]
        #: fairseq-generate strips these from printed hypotheses
        self.symbols_to_strip_from_output = {self.eos, self.bos}
        #: longest hypothesis (without <s> and </s>) every model of the ensemble can hold
        self.max_len = min(m.decoder.max_positions() for m in models) - 2
