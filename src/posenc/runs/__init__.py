"""Run plumbing that the laboratory, ``posenc extend`` and the tools share: files written atomically
(:mod:`.files`) and figures too (:mod:`.figures`), what a run ran on (:mod:`.provenance`), markdown tables
(:mod:`.tables`), the device asked for (:mod:`.devices`), the memory and peak that work used
(:mod:`.memory`) and the statistics of its results (:mod:`.statistics`)."""
