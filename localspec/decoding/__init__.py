"""The algorithm of speculative decoding, testable without a model.

Sampling turns a row of logits into the target's processed distribution (`sampling`, `dists`);
`acceptance` is the rejection rule that keeps that distribution exact; drafters propose tokens
(`drafters`: a draft model and prompt lookup; `lookup`: the n-gram store; `auto`: the per-step
choice between them); the k controller measures costs and α and picks the draft length
(`controller`, a package: costs, α, policy); `decoder` is the loop itself (`overlap`: the draft model
drafting on while the target verifies); `stream` turns its steps into text and
`stats` into the numbers every report shows.

May import: `localspec.config`, `localspec.machine`, `localspec.tokens`, numpy. Must never import
the engine (a model reaches it as an object with a small interface), the loading layer, the CLI,
the server, bench, doctor, saved chats or the UI.
"""
