"""The panels a command's --help groups its options in, in the order they are shown.

A command's own options (the prompt's, the output's, the server's) stay in Typer's first panel,
"Options", with --help; the options the model commands share follow, grouped by what they set.
How defaults are shown: `help_style.plain_help`.
"""

MODEL = "Model"
SAMPLING = "Sampling"
CONSTRAINTS = "Constraints"
SPECULATION = "Speculation"
DEVICES = "Threads, GPU and placement"

ORDER = (MODEL, SAMPLING, CONSTRAINTS, SPECULATION, DEVICES)
"""The shared panels' order, after "Options"."""
