"""``LanguageTaggedDataset``: a language-pair dataset whose batches say which languages they hold.

Multilingual KERMIT (task ``kermit`` with ``--lang-pairs``) trains on one dataset per pair,
concatenated (:class:`MultiPairDataset`, whose collater is the first part's): every item carries
the ids of its two languages, and :meth:`LanguageTaggedDataset.collater` puts them in
``net_input["src_lang"]`` / ``net_input["tgt_lang"]`` (B,), in the batch's own (length-sorted) order,
whichever part each item came from.
"""
import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, ConcatDataset, data_utils


class LanguageTaggedDataset(BaseWrapperDataset):
    def __init__(self, dataset, src_lang_id, tgt_lang_id):
        super().__init__(dataset)
        self.src_lang_id = int(src_lang_id)
        self.tgt_lang_id = int(tgt_lang_id)

    @property
    def src_sizes(self):
        return self.dataset.src_sizes

    @property
    def tgt_sizes(self):
        return self.dataset.tgt_sizes

    def __getitem__(self, index):
        item = self.dataset[index]
        item["src_lang"] = self.src_lang_id
        item["tgt_lang"] = self.tgt_lang_id
        return item

    def collater(self, samples, **extra_args):
        if len(samples) == 0:
            return {}
        # collate sorts the samples by length and reports their order through "id": give each sample
        # its list position as id, so that the languages (and the ids given) follow the same order
        ids = [s["id"] for s in samples]
        renumbered = [dict(s, id=j) for j, s in enumerate(samples)]
        batch = self.dataset.collater(renumbered, **extra_args)
        if not batch:
            return batch
        order = batch["id"].tolist()
        batch["id"] = torch.tensor([ids[j] for j in order], dtype=torch.long)
        batch["net_input"]["src_lang"] = torch.tensor([samples[j]["src_lang"] for j in order], dtype=torch.long)
        batch["net_input"]["tgt_lang"] = torch.tensor([samples[j]["tgt_lang"] for j in order], dtype=torch.long)
        return batch


class MultiPairDataset(ConcatDataset):
    """Language-pair datasets concatenated, batched like one ``LanguagePairDataset``: shuffled, then
    ordered by target and source length (fairseq's ``ConcatDataset`` orders without shuffling, so
    equal-length batches would hold one pair each), and filtered by both sides' sizes."""

    def __getitem__(self, idx):
        item = super().__getitem__(idx)
        item["id"] = idx  # the parts number their items from 0: ids unique over the concatenation
        return item

    def __init__(self, datasets, shuffle=True):
        super().__init__(datasets)
        self.shuffle = shuffle
        self.src_sizes = np.concatenate([d.src_sizes for d in datasets])
        tgt = [d.tgt_sizes for d in datasets]
        self.tgt_sizes = None if any(t is None for t in tgt) else np.concatenate(tgt)

    @property
    def sizes(self):
        return self.src_sizes if self.tgt_sizes is None else np.vstack((self.src_sizes, self.tgt_sizes)).T

    def num_tokens(self, index):
        return max(self.src_sizes[index], self.tgt_sizes[index] if self.tgt_sizes is not None else 0)

    def num_tokens_vec(self, indices):
        sizes = self.src_sizes[indices]
        return sizes if self.tgt_sizes is None else np.maximum(sizes, self.tgt_sizes[indices])

    def size(self, index):
        return (self.src_sizes[index], self.tgt_sizes[index] if self.tgt_sizes is not None else 0)

    def ordered_indices(self):
        indices = np.random.permutation(len(self)).astype(np.int64) if self.shuffle else np.arange(len(self), dtype=np.int64)
        if self.tgt_sizes is not None:
            indices = indices[np.argsort(self.tgt_sizes[indices], kind="mergesort")]
        return indices[np.argsort(self.src_sizes[indices], kind="mergesort")]

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(
            self.src_sizes, self.tgt_sizes, indices, max_sizes)
