"""`localspec doctor`: checks the llama.cpp build, a target/draft pair and this machine.

`checks` gathers the facts (build, GPU offload, files, vocabularies, cores, load) and the warm
start record; `calibrate` measures the verify cost by batch size and α per drafter and recommends
a drafter and k; `report` prints them.

May import the engine, the algorithm and the loading layer. Must never import the CLI, the
server, bench, saved chats or the UI.
"""
