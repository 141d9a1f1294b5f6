"""Benchmark harness shared by the project's NAT / AT benchmarks.

One concept per module:

* :mod:`.scoring`     BPE removal, Moses (de)tokenisation, sacreBLEU and tokenised BLEU, repeat rate
* :mod:`.decoding`    decoding strings (``beam=5``, ``iter=10,len_beam=3``) <-> fairseq generation options
* :mod:`.inference`   load a checkpoint, decode a split with ``task.inference_step``, in test order
* :mod:`.timing`      batch-1 latency and batch-128 throughput of an already loaded model
* :mod:`.provenance`  system name, training updates / wall time, hardware description
* :mod:`.results`     the results JSON: schema, validator, upsert, hypothesis file names
* :mod:`.tables`      Markdown tables from results files, README marker replacement (CLI)
* :mod:`.plot`        BLEU vs latency scatter per benchmark
* :mod:`.run`         the CLI that benchmarks one system (``python -m fairseq_nat_ext.benchmark.run``)
* :mod:`.ctc_filtered` training pairs a CTC checkpoint cannot align (reported in the results' data)

Only :mod:`.inference`, :mod:`.timing` and :mod:`.run` use torch / fairseq themselves (importing the
plugin package still imports fairseq to register its components).
"""
