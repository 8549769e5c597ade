"""A run's checkpoints: the `Checkpoints` object (`checkpoints`), one step directory's files
and their sha256 seals (`files`), the pure rules both follow (`rules`), and what a resumed
or initialised-from run must share with the checkpoint it starts from (`resume`).
"""
