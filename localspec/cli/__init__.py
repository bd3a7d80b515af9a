"""The command line: `localspec` and its commands (Typer).

`app` is the entry point (`main`) and the `generate` command; `options` holds the options every
command shares and the one `error:` line of bad input (exit code 2), `panels` the groups --help
shows them in and `help_style` the one look of every help (placeholders, defaults in words); each
other module registers
one command group (`bench`, `doctor`, `history`, `presets` for models/pull, `serve`). The `chat`
command comes from the UI package through the "localspec.commands" entry point.

May import every layer of localspec. Must never import the UI (`localspec_tui`, textual): the UI
plugs itself in. Nothing but `localspec.__main__` imports `app`.
"""
