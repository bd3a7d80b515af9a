"""Saved chats: what a conversation is and how it is stored, fitted and exported.

`conversation` holds the records (messages, titles) and fits a history into the context; `store`
is the SQLite history (one writer, crash-safe partial replies); `export` writes a conversation as
Markdown or JSON.

May import: `localspec.config` and `localspec.tokens` only. Must never import the engine, the
algorithm, the loading layer, a command or the UI: saved chats are read without a model.
"""
