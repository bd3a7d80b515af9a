"""`localspec bench`: plain against speculative decoding on a prompt suite, interleaved.

`run` runs the variants in turn over the prompts and repeats (so that ratios come from the same
minutes of the machine) and writes the JSON report (docs/bench-schema.md); `report` groups the
runs and prints the table.

May import the engine, the algorithm and the loading layer. Must never import the CLI, the
server, doctor, saved chats or the UI.
"""
