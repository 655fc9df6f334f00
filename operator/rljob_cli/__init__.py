"""`rljob`: the command line (local mode `rljob run`, `rljob status`)."""
