"""The panels a command's --help groups its options in, in the order they are shown.

A command's own options (the prompt's, the output's, the server's) stay in Typer's first panel,
"Options", with --help; the options the model commands share follow, grouped by what they set.
Every default is written in the option's help, in words: "(default 0.8)", "(default: by free
memory)". Typer's own `[default: …]` is not shown (`options.plain_placeholders` turns it off), as
most shared options default to None so that a preset's value can be told from a flag, and Typer
would show nothing for those.
"""

MODEL = "Model"
SAMPLING = "Sampling"
CONSTRAINTS = "Constraints"
SPECULATION = "Speculation"
DEVICES = "Threads, GPU and placement"

ORDER = (MODEL, SAMPLING, CONSTRAINTS, SPECULATION, DEVICES)
"""The shared panels' order, after "Options"."""
