"""Evaluation: score and time a model the same way the project's benchmarks do.

One concept per module:

* :mod:`.scoring`          BPE removal, Moses (de)tokenisation, sacreBLEU and tokenised BLEU, repeat rate
* :mod:`.decoding`         decoding strings (``beam=5``, ``iter=10,len_beam=3``) <-> fairseq generation options
* :mod:`.inference`        load a checkpoint, decode a split with ``task.inference_step``, in test order
* :mod:`.timing`           batch-1 latency and batch-128 throughput of an already loaded model
* :mod:`.provenance`       system name, training updates / wall time, hardware description
* :mod:`.results`          the results JSON: schema, validator, upsert, hypothesis file names
* :mod:`.run`              the CLI that evaluates one system (``python -m fairseq_nat_ext.evaluation.run``)
* :mod:`.ctc_filtered`     training pairs a CTC checkpoint cannot align (reported in the results' data)
* :mod:`.pointer_metrics`  pointer-network metrics (sequence accuracy, hull area and triangle coverage, tours)
* :mod:`.translate`        translate a data-bin split with any checkpoint and score it (CLI)
* :mod:`.tune_eos_penalty` choose KERMIT's end-of-slot penalty on the validation split (CLI)

Only :mod:`.inference`, :mod:`.timing`, :mod:`.run` and :mod:`.ctc_filtered` use torch / fairseq
themselves (importing the plugin package still imports fairseq to register its components).  The
project's own studies, plots and table writers (``python -m benchmarks.tables``, ``benchmarks.plot``...)
live in the repository's top-level ``benchmarks/`` folder, which is not installed.
"""
