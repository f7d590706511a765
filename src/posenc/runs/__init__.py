"""Run plumbing that the laboratory, ``posenc extend`` and the tools share: files written atomically
(:mod:`.files`), what a run ran on (:mod:`.provenance`), markdown tables (:mod:`.tables`) and the memory
and peak that work used (:mod:`.memory`)."""
