"""Data tools: the synthetic multi-modal corpus, parallel-corpus validation, helpers of the examples/
recipes (Moses tokenisation, distillation) and fertility files (fertility, make_fertility,
fertility_dataset).  Nothing here imports fairseq at import time except fertility_dataset (imported
by the task when needed); validate_parallel, moses_tokenize and distill_utils also run as plain
scripts."""
