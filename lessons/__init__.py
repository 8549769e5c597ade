"""lessons — `make lessons`: the case study's failures replayed end to end (the pipeline, the trainer,
`compare` and the audit run as commands) and the contamination lesson; `python -m lessons`.

Above compare/ (it runs the whole product as subprocesses and draws with compare's report), beside
bench/ (a reproducible program a user runs, with its own checked output folder, not a measurement
whose numbers go into bench/RESULTS.md). `cli` (the command, the loss lessons and the summary
pages), `contamination` (the planted-instances lesson) and `io` (what every lesson shares: reuse of
an earlier output, the commands, the sample's prose, the trainer recipe the runs start from).
"""
