"""Decoding of the ``glat`` arch: one decoder pass (GLAT is a one-pass NAT).

The top ``--iter-decode-with-beam`` l predicted lengths of each sentence become l candidates, decoded in
one batch from the source copied to each length (``--glat-copy``); the candidate of best mean
log-probability is returned (the paper's length beam without an AT reranker).  It is
``generators/iterative_refinement.py``'s first pass (the same fast CPU route), with the number of passes
fixed to one: ``--iter-decode-max-iter`` does not apply.
"""
from .iterative_refinement import RefinementGenerator


class GLATGenerator(RefinementGenerator):
    decoding_keys = ("len_beam",)

    def __init__(self, models, tgt_dict, length_beam=1, retain_history=False, **unused):
        super().__init__(models, tgt_dict, max_iter=1, length_beam=length_beam, adaptive=True,
                         retain_history=retain_history)

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, length_beam=getattr(args, "iter_decode_with_beam", 1),
                   retain_history=getattr(args, "retain_iter_history", False))
