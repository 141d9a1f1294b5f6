"""Data tools: the synthetic multi-modal corpus, parallel-corpus validation, and helpers of the
examples/ recipes (Moses tokenisation, distillation).  Nothing here imports fairseq at import time;
validate_parallel, moses_tokenize and distill_utils also run as plain scripts."""
