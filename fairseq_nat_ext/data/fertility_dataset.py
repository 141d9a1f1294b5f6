"""A language-pair dataset with fertility targets: batches gain ``sample["fertility"]``, long (B, S)
aligned with ``net_input.src_tokens`` (padding and ``</s>`` get 0)."""
import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

from ..compat import InputError


class FertilityDataset(BaseWrapperDataset):
    def __init__(self, dataset, rows, filename):
        super().__init__(dataset)
        self.rows = rows
        self.filename = filename

    @property
    def src_sizes(self):
        return self.dataset.src_sizes

    @property
    def tgt_sizes(self):
        return self.dataset.tgt_sizes

    def num_tokens_vec(self, indices):
        return self.dataset.num_tokens_vec(indices)

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        src = batch["net_input"]["src_tokens"]
        real = src.ne(self.dataset.src_dict.pad())  # (B, S)
        counts = real.sum(1).tolist()
        values = []
        for b, sid in enumerate(batch["id"].tolist()):
            row = self.rows[sid]
            extra = counts[b] - row.size  # the source's </s> (and nothing else) gets 0
            if extra != 1:
                raise InputError(f"fertility: {self.filename} line {sid + 1}: {row.size} values for a "
                                 f"source of {counts[b]} tokens (with </s>)")
            values.append(np.concatenate([row, np.zeros(1, dtype=np.int64)]))
        fert = torch.zeros(src.shape, dtype=torch.long)
        fert[real] = torch.from_numpy(np.concatenate(values))  # row-major = each row's token order
        batch["fertility"] = fert
        return batch
