"""Test hook, active when this directory is on PYTHONPATH and RANK_DUMP_DIR is set: a fairseq-train
process of any rank saves its model parameters to RANK_DUMP_DIR/rank{RANK}.pt when it exits.
fairseq itself saves rank 0's state only; the distributed test compares the ranks with this."""
import atexit
import os
import sys

if os.environ.get("RANK_DUMP_DIR") and os.path.basename(sys.argv[0] if sys.argv else "") == "fairseq-train":
    from fairseq import trainer as _trainer_module

    _seen = []
    _original_init = _trainer_module.Trainer.__init__

    def _init(self, *args, **kwargs):
        _original_init(self, *args, **kwargs)
        _seen.append(self)

    def _dump():
        if not _seen:
            return
        import torch

        trainer = _seen[-1]
        params = {}
        for name, value in trainer.model.state_dict().items():
            params[name[len("module."):] if name.startswith("module.") else name] = value.detach().cpu().clone()
        path = os.path.join(os.environ["RANK_DUMP_DIR"], f"rank{os.environ.get('RANK', '0')}.pt")
        torch.save({"params": params, "num_updates": trainer.get_num_updates()}, path)

    _trainer_module.Trainer.__init__ = _init
    atexit.register(_dump)
